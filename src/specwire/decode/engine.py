"""The speculative decoding engine: EAGLE-3 drafts proposing, the target verifying, losslessly.

Owns: `SpecConfig` (depth, branching, tree budget, context lookup), loading a draft *against* a target
(`load_engine_draft`: the wiring contract is checked here, at serving time), the per-request state of `auto`
(`AutoBudget`), the generate loop with the target's KV cache kept to exactly the accepted path, and
per-request metrics. Does not own the draft's proposals and its KV cache (`proposer`), the acceptance maths
(`verify`), tree structure (`tree`), copied tokens (`lookup`), the distributions (`sampling`) or the plain
oracle (`plain`); does not tokenize.

One round, for the last accepted target position b (EAGLE-3, Li et al. 2025):
  1. draft: for each accepted-but-unfed position t, the draft gets the target's fused states g_t
     (captured by hooks during the target pass that produced them) and embed(x_{t+1}); its output at
     b predicts x_{b+2}. The root x_{b+1} is the target's last produced token. The draft then
     expands a chain (one token per step) or an EAGLE-2 tree (top-k per step, the top-k nodes by
     cumulative log-probability expanded further, `num_draft_tokens` kept). Every draft node is fed
     at position b (see below); the draft's tree entries are dropped from its cache after proposing.
     In greedy decoding, tokens copied from the context (`decode.lookup`) may join the tree as one more branch.
  2. verify: one target pass over [root, draft nodes] at positions b+1+depth, with a tree attention
     mask (a 4D mask passed to the HF model; a chain needs only the causal mask).
  3. keep: the target's KV cache keeps the root and the accepted nodes, compacted into place by one
     gather per layer (no recomputation); their captured states become the draft's next input, paired
     with the tokens shifted by one (accepted tokens, then the bonus token, which is the next root).
Draft positions follow the training convention (`training.ttt.ttt_unroll`): a real input (g_t, x_{t+1}) sits
at position t, and every drafted node of a round, at any depth, at position b, as TTT step d at
position t keeps the position id t (EAGLE-3 reference training, SpecForge). EAGLE's inference code,
SGLang and vLLM instead feed a depth-d node at b+d, which the draft never saw in training; measured on
the self-distilled setup of the online-vs-offline tests, b+d lowers live acceptance at every draft
position past 0 and the accept length of chains and trees alike.

Metrics in `GenerationResult.extra`:
  accept_length        mean tokens produced per verification pass (accepted draft and copied tokens + 1
                       bonus), counted before truncation at EOS / max-new-tokens; the prefill is not a pass.
  accept_per_position  the draft's own (copied tokens are not counted): entry k: among verification passes in
                       which draft position k was *reached*
                       (positions 0..k-1 all accepted and the tree had a node at depth k+1), the
                       fraction in which a draft token at depth k+1 was accepted. Position 0 is reached
                       in every pass. 0.0 where never reached. `accept_counts`/`reach_counts` hold the
                       raw numbers.
  draft_s, verify_s, plain_s, other_s   wall time in the draft (prefill included), in verify passes (the
                       target's prefill included) + acceptance + KV compaction, in the plain steps `auto`
                       chose instead of speculating, and elsewhere. No extra device syncs are added for timing, so
                       on an asynchronous device the split is approximate (the totals are exact).
  target_forwards, num_verify_passes, tree (the mode actually used), tree_fallback (why not, if so).
  budget               "auto" or "fixed"; budget_used: rounds per budget label ("none": plain steps that
                       `auto` chose instead of speculating), and under auto the costs it used (target_ms by
                       pass size, draft_ms by width, the learnt overhead_ms, scale and pass_ratio by size,
                       probes, explored); plain_steps.
  lookup               copied tokens (`decode.lookup`): rounds that verified some, tokens verified, accepted
                       beyond the draft's, "alone" (rounds of copied tokens only, in `auto`'s plain steps),
                       max (the cap; 0 when off), rates (the copies' live acceptance per position).

Under `SpecConfig.budget == "auto"` (`AutoBudget`; the maths and the replan, probe and explore rules in
`decode.budget`) each round's depth, branching and token count come from the target's cost curve
(`decode.kernels.cost_curve`), the draft's measured step cost (`draft_step_ms`) and its acceptance
(acceptance.json, corrected by live rounds). When no speculation pays, the request takes plain steps and
probes with speculation now and then; the draft then first reads the positions it skipped. Every
target pass and round is timed: the curve's live ratio per pass size and the per-round overhead are
learnt from them and carried to the next request of the same target and draft (`_learnt_costs`), and
so is the live acceptance, per mode, over at most CARRY_ROUNDS rounds (`_learnt_acceptance`).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from specwire.target.capture import capture_hooks
from specwire.target.bf16dot import available as bf16dot_available
from specwire.target.fastlinear import amx_linears, linear_kind, q8_0_linears, rowdot_linears, split3_linears
from specwire.target.hardware import synchronize
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows
from specwire.target.rownorm import rownorm_layers
from specwire.draft.checkpoint import load_draft
from specwire.draft.model import Eagle3Draft
from specwire.errors import SpecwireError, WiringMismatch
from specwire.decode.budget import (DEFAULT_ACCEPTANCE, DEFAULT_ACCEPTANCE_TOPK, AcceptanceModel, Budget, CostModel,
                                    Planner, evaluate)
from specwire.decode.draft_step import ServedStep, draft_kernel
from specwire.decode.lookup import Graft, LookupModel, NgramIndex, follow, graft, tail_length
from specwire.decode.plain import GenerationResult, check_request
from specwire.decode.proposer import DraftProposer, EagleProposer, primed_proposer
from specwire.decode.sampling import SamplingParams, greedy_token, logits_to_probs, make_generator, next_token
from specwire.target.load import Target, tokenizer_fingerprint
from specwire.decode.tree import DraftTree, pass_mask, root_only
from specwire.decode.verify import VerifyResult, verify_chain_sampled, verify_greedy, verify_tree_sampled
from specwire.wiring import validate_hs_ids


BUDGET_MODES = ("auto", "fixed")


@dataclass
class SpecConfig:
    """Speculation knobs (SGLang's names: --speculative-num-steps / -eagle-topk / -num-draft-tokens).

    With budget "auto" (the default) the three numbers are caps: each round runs the depth, branching and
    token count that `decode.budget` expects to give the most tokens per second, possibly none.
    """

    num_steps: int = 5  # draft depth: draft tokens on the longest path (a cap under --budget auto)
    topk: int = 4  # branching per tree step (a chain always uses 1; a cap under --budget auto)
    num_draft_tokens: int = 16  # tree budget: draft tokens verified per pass, kept by cumulative draft probability (a cap under --budget auto)
    tree: bool = True  # tree (EAGLE-2 dynamic) or chain drafting
    budget: str = "auto"  # "auto": choose the depth/branching/tokens per round by measured cost and acceptance; "fixed": use them as given
    lookup: int = 8  # context lookup: at most this many tokens copied from where the text's last words occurred before, verified beside the draft's (greedy decoding; 0: off; a cap under --budget auto)

    def __post_init__(self):
        if self.budget not in BUDGET_MODES:
            raise SpecwireError(f"SpecConfig.budget: expected one of {', '.join(BUDGET_MODES)}, found {self.budget!r}.",
                                fix="--budget auto")
        for name in ("num_steps", "topk", "num_draft_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                default = type(self).__dataclass_fields__[name].default
                raise SpecwireError(f"SpecConfig.{name}: expected a positive integer, found {v!r}.",
                                    fix=f"--{name.replace('_', '-')} {default}")
        if not isinstance(self.lookup, int) or isinstance(self.lookup, bool) or self.lookup < 0:
            raise SpecwireError(f"SpecConfig.lookup: expected an integer >= 0, found {self.lookup!r}.", fix="--lookup 8")

    def to_dict(self) -> dict:
        return asdict(self)


# ---- loading a draft against a target -------------------------------------------------------------

def draft_fit_problems(draft: Eagle3Draft, target: Target) -> list[str]:
    """Everything that keeps `draft` from reading `target`'s states, as readable lines (empty = fits)."""
    c = draft.config
    w = c.wiring
    # compare the target identities only (hs ids emptied: they are checked against the target's depth below)
    problems = w.replace(hs_ids=(), target=target.spec).differences(
        w.replace(hs_ids=()), ignore=("hs_ids", "norm_before_residual", "draft_vocab_size", "tokenizer_fingerprint",
                                      "chat_template_hash"))
    try:
        validate_hs_ids(w.hs_ids, target.num_layers, what="draft hs ids")
    except SpecwireError as e:
        problems.append(str(e).rstrip("."))
    if c.target_hidden_size != target.info.hidden_size:
        problems.append(f"fc input: the draft fuses states of width {c.target_hidden_size}, the target's hidden size "
                        f"is {target.info.hidden_size}")
    if c.hidden_size != target.info.hidden_size:
        problems.append(f"draft hidden size {c.hidden_size} differs from the target's embedding width "
                        f"{target.info.hidden_size} (the draft reads the target's token embeddings)")
    if c.vocab_size != target.info.vocab_size:
        problems.append(f"vocab: the draft maps into {c.vocab_size} target ids, the target has {target.info.vocab_size}")
    if w.tokenizer_fingerprint and target.tokenizer is not None:
        found = tokenizer_fingerprint(target.tokenizer)
        if found != w.tokenizer_fingerprint:
            problems.append(f"tokenizer fingerprint: the draft was trained with {w.tokenizer_fingerprint}, "
                            f"the target's tokenizer is {found}")
    return problems


DRAFT_WEIGHTS = ("q8_0", "exact")  # how a served draft reads its weights where the bf16 kernel runs


def load_engine_draft(name_or_path, target: Target, *, hs_ids_override: list[int] | None = None,
                      weights: str = "q8_0") -> Eagle3Draft:
    """Load a draft for serving with `target`: refuse a wiring that does not fit, attach embeddings.

    Where the draft runs rowdot and the CPU has AVX512-BF16, `weights` says how its products read its weights:
    "q8_0" (the default), the nearest q8_0 codes with the inputs quantized per block to int16
    (`fastlinear.q8_0_linears`: lossy for the draft, a warm step about three fifths of the exact one's, its
    proposals accepted as often), or "exact", the weights as stored with the inputs split exactly into three bf16
    parts (`fastlinear.split3_linears`).
    Either way decoding stays the target's greedy: the verify pass decides every token.
    hs_ids_override (experiments only) replaces the draft's hs ids; it must keep their count.
    """
    if weights not in DRAFT_WEIGHTS:
        raise SpecwireError(f"draft weights: expected one of {', '.join(DRAFT_WEIGHTS)}, found {weights!r}.")
    kernel = draft_kernel(target)
    draft = load_draft(name_or_path, device=target.device, dtype=torch.float32 if kernel == "rowdot" else target.dtype)
    c = draft.config
    if hs_ids_override is not None:
        ids = [int(i) for i in hs_ids_override]
        validate_hs_ids(ids, target.num_layers, expected_count=c.num_fused, what="hs ids override")
        c.wiring = c.wiring.replace(hs_ids=tuple(ids))
    problems = draft_fit_problems(draft, target)
    if problems:
        raise WiringMismatch(
            f"draft '{name_or_path}' does not fit target '{target.info.name}': " + "; ".join(problems) + ".",
            fix="use the draft trained for this target (or retrain it with `specwire datagen` + `specwire train` "
                "on this target); `specwire doctor` explains the wiring.",
        )
    draft.attach_embeddings(target.parts.embed)  # (the draft casts what it reads from the target to its own dtype)
    if kernel == "rowdot":  # a draft stored in bf16 is read as bf16: exactly the same products at half the bytes
        rowdot_linears(draft, forms=("bf16",))
        rownorm_layers(draft)  # its four norms compiled: each one call, not torch's eight ops (`target.rownorm`)
        if not bf16dot_available()[0]:
            pass  # rowdot over the (bf16) weights
        elif weights == "q8_0":  # `bf16dot.q8i16dot` over the nearest q8_0 codes
            q8_0_linears(draft)
        else:  # the bf16 kernel over the weights, float32 inputs in three exact bf16 parts
            split3_linears(draft)
    elif kernel == "amx":
        amx_linears(draft)
    draft.served = ServedStep.build(draft)  # the decoding pass: packed products, fewer ops (`decode.draft_step`)
    return draft


# ---- the target side -----------------------------------------------------------------------------------

def tree_unsupported(target: Target, cache) -> str | None:
    """Why a tree pass cannot run on this target (then the engine drafts chains), or None."""
    from specwire.target.attention import INVARIANT_NAMES
    from specwire.target.kvcache import croppable

    impl = getattr(target.model.config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager", *INVARIANT_NAMES):
        return f"attention implementation '{impl}' takes no custom 4D tree mask"
    if not croppable(cache):
        return "the target's KV cache has non-plain layers (sliding window / recurrent); no tree compaction"
    return None


def target_tree_mask(tree: DraftTree, past: int, target: Target) -> torch.Tensor:
    """The 4D mask of a tree pass (`tree.pass_mask`): bool, or additive for eager attention."""
    eager = target.model.config._attn_implementation == "eager"
    return pass_mask(tree, past, additive=target.dtype if eager else None)


def keep_accepted(cache, past: int, keep: list[int]) -> None:
    """Keep the cached prefix and the tree nodes `keep` (root first) in that order, dropping the rest.

    The accepted branch's K/V are gathered into place once per layer; a contiguous prefix is just cropped.
    """
    m = len(keep)
    if keep != list(range(m)):
        idx = torch.tensor(keep, dtype=torch.long, device=cache.layers[0].keys.device) + past
        for layer in cache.layers:
            layer.keys[..., past:past + m, :] = layer.keys[..., idx, :]  # shape: [B, nkv, m, d]
            layer.values[..., past:past + m, :] = layer.values[..., idx, :]
    remove = cache.get_seq_length() - (past + m)
    if remove > 0:
        cache.crop(-remove)


# ---- the speculation budget per round -------------------------------------------------------------------

_draft_costs: "weakref.WeakKeyDictionary[Eagle3Draft, dict]" = weakref.WeakKeyDictionary()
# target model -> draft -> (overhead_ms, per-size ratios) that `auto` learnt, carried from one request to the next
_learnt_costs: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()
# target model -> draft -> {tree mode: live acceptance counts (`AcceptanceModel.live`)}, carried the same way
_learnt_acceptance: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()
CARRY_ROUNDS = 256  # the most rounds per draft position whose acceptance a new request starts from


@torch.inference_mode()
def draft_step_ms(draft: Eagle3Draft, widths=(1, 2, 3, 4), *, context: int = 64, reps: int = 15) -> dict[int, float]:
    """Median ms of one draft step over w rows after `context` cached positions, for each w (memoized per draft,
    thread count and dtype)."""
    key = (torch.get_num_threads(), draft.fc.weight.dtype, tuple(widths))
    memo = _draft_costs.setdefault(draft, {})
    if key in memo:
        return memo[key]
    c = draft.config
    w0 = draft.fc.weight
    proposer, ids = primed_proposer(draft, context, room=max(widths))
    out = {}
    for w in widths:
        h = torch.zeros(1, w, c.hidden_size, device=w0.device, dtype=w0.dtype)
        mask = None if w == 1 else torch.ones(1, 1, w, context + w, dtype=torch.bool, device=w0.device)
        times = []
        for r in range(reps + 1):
            t0 = time.perf_counter()
            logits, _ = proposer._step(h, ids[:, :w], proposer._rope(context - 1, w, repeat=True), mask,
                                       last_only=w == 1)
            torch.log_softmax(logits.float(), -1).topk(min(4, logits.shape[-1]))
            if r:
                times.append(time.perf_counter() - t0)
            proposer.cache.crop(context)
        out[w] = 1000 * sorted(times)[len(times) // 2]
    memo[key] = out
    return out


class AutoBudget:
    """`auto`: the budget of each round (`budget.Planner`), from the target's cost curve, the draft's step cost
    and acceptance.

    The acceptance starts from the draft's acceptance.json (a cautious prior without one), corrected by the
    live rounds of earlier requests of the same target, draft and mode (tree or chain; at most CARRY_ROUNDS
    per position), and learns from the request's own rounds. The cost curve's live ratio per pass size and the
    per-round overhead are learnt from timed passes and rounds, and carried to the next request the same way.
    """

    def __init__(self, target: Target, draft: Eagle3Draft, spec: SpecConfig, tree: bool):
        from specwire.decode.kernels import cost_curve

        acc = getattr(draft, "acceptance", None)
        if acc is None:
            self.acceptance = AcceptanceModel(list(DEFAULT_ACCEPTANCE), list(DEFAULT_ACCEPTANCE_TOPK))
        else:
            self.acceptance = AcceptanceModel(list(acc.step_accuracy), list(acc.step_accuracy_topk), acc.topk)
        curve = cost_curve(target)
        widths = tuple(range(1, max(1, spec.topk if tree else 1) + 1))
        self.cost = CostModel(dict(zip(curve.tokens, curve.ms)), draft_step_ms(draft, widths))
        self._learnt = _learnt_costs.setdefault(target.model, weakref.WeakKeyDictionary())
        self._draft = draft
        overhead, passes = self._learnt.get(draft, (0.0, {}))
        self.cost.overhead_ms, self.cost.passes = overhead, {T: list(v) for T, v in passes.items()}
        self._learnt_live = _learnt_acceptance.setdefault(target.model, weakref.WeakKeyDictionary()).setdefault(draft, {})
        carried = self._learnt_live.get(tree)
        if carried and len(carried) == self.acceptance.depth:
            self.acceptance.live = [list(counts) for counts in carried]
        self.carried_rounds = int(max((c[1] for c in self.acceptance.live), default=0))  # (what it starts from)
        self.lookup = LookupModel(live=[list(c) for c in self._learnt_live.get("lookup", [])])
        self.tree = tree
        self.plan = Planner(self.acceptance, self.cost, spec.num_steps, spec.topk, spec.num_draft_tokens, tree)

    def next(self) -> Budget:
        return self.plan.next()

    def _keep_costs(self) -> None:
        self._learnt[self._draft] = (self.cost.overhead_ms, self.cost.passes)

    def observe_pass(self, T: int, ms: float) -> None:
        """One timed target pass over T tokens (a plain step or a verify pass)."""
        self.cost.learn_pass(T, ms)
        self._keep_costs()

    def observe(self, budget: Budget, depth: int, accepted: int, round_ms: float | None) -> None:
        """One round's outcome: the tree's depth, the draft tokens accepted, and its wall time (None: a round whose
        time says nothing about the next ones, such as one where the draft first reads the prompt or a backlog of
        plain steps)."""
        k = min(depth, budget.num_steps)
        self.acceptance.observe(budget, [int(accepted >= j) for j in range(k)], [int(accepted > j) for j in range(k)])
        self._learnt_live[self.tree] = self.acceptance.carried(CARRY_ROUNDS)
        if round_ms is not None:
            self.cost.learn_round(budget, round_ms)
            self._keep_costs()

    def lookup_tail(self, budget: Budget, T: int, shared: int, available: int) -> int:
        """How many of `available` copied tokens past the first `shared` (already in the draft's tree of T tokens)
        this round should verify: those that pay for their rows by the lookup's live acceptance."""
        choice = evaluate(budget, self.acceptance, self.cost)
        base_ms = self.cost.target(T)
        return tail_length(self.lookup.rates(shared + available), shared, available, choice.tokens_per_round,
                           choice.ms_per_round, lambda t: self.cost.target(T + t) - base_ms)

    def observe_lookup(self, copied: Graft, accepted: list[int]) -> None:
        self.lookup.observe(copied.path, accepted)
        self._learnt_live["lookup"] = self.lookup.carried(CARRY_ROUNDS)

    def report(self) -> dict:
        return {"budgets_used": dict(self.plan.used), "overhead_ms": round(self.cost.overhead_ms, 3),
                "scale": round(self.cost.scale, 3), "probes": self.plan.probes, "explored": self.plan.explored,
                "carried_rounds": self.carried_rounds,
                "pass_ratio": {T: round(r, 3) for T, (r, _) in sorted(self.cost.passes.items())},
                "target_ms": {t: round(v, 2) for t, v in self.cost.target_ms.items() if t in (1, 2, 4, 8, 16, 17)},
                "draft_ms": {w: round(v, 3) for w, v in self.cost.draft_ms.items()}}


def _copy_branch(tree: DraftTree, proposal: list[int], auto: AutoBudget | None, budget: Budget, *,
                 trees: bool) -> Graft | None:
    """The draft's `tree` with the copied `proposal` grafted on (`decode.lookup.graft`), cut under `auto` to the
    length that pays; None where nothing is added (the proposal is in the tree already, does not pay, or would
    branch off a chain on a target that takes no tree pass). The tree is built once, after the cut."""
    shared = follow(tree, proposal)
    if not trees and not (tree.is_chain and len(shared) == tree.size - 1):  # the copy would branch off the chain
        return None
    available = len(proposal) - len(shared)
    tail = available if auto is None or not available else auto.lookup_tail(budget, tree.size, len(shared), available)
    return graft(tree, proposal[:len(shared) + tail], shared) if tail else None


def _count_copies(copies: dict, copied: Graft, res: VerifyResult, drafted: int) -> None:
    """Add one round's copied branch to the request's counts: `drafted` of the accepted tokens were the draft's."""
    copies["rounds"] += 1
    copies["tokens"] += copied.added
    copies["accepted"] += res.num_accepted - drafted
    copies["alone"] += copied.base == 1


def fixed_budget(spec: SpecConfig, tree: bool) -> Budget:
    return Budget(spec.num_steps, spec.topk, spec.num_draft_tokens) if tree and spec.topk > 1 else Budget(spec.num_steps)


class _Stats:
    def __init__(self, depth: int):
        self.reach = [0] * depth
        self.accept = [0] * depth
        self.passes = 0
        self.produced = 0

    def add(self, tree: DraftTree, n: int, produced: int) -> None:
        """One verify pass over the draft's `tree`, of whose tokens `n` were accepted, producing `produced` tokens
        (copied ones included)."""
        self.passes += 1
        self.produced += produced
        for k in range(min(tree.max_depth, len(self.reach))):
            if n >= k:
                self.reach[k] += 1
                if n > k:
                    self.accept[k] += 1


@torch.inference_mode()
def speculative_generate(
    target: Target,
    draft: Eagle3Draft | DraftProposer,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 128,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    tree: bool = True,
    spec: SpecConfig | None = None,
    on_token: Callable[[int], None] | None = None,
    stop_on_eos: bool = True,
) -> GenerationResult:
    """Decode up to `max_new_tokens` tokens speculatively; output distributed exactly as `plain_generate`.

    Tree drafting is used when both `tree` and `spec.tree` are true (and the target takes a tree mask,
    else chains, noted in extra["tree_fallback"]). `draft` is an `Eagle3Draft` from `load_engine_draft`,
    or any `DraftProposer`.
    """
    check_request(target, prompt_ids, max_new_tokens)
    spec = spec or SpecConfig(tree=tree)
    use_tree = tree and spec.tree
    if generator is None and not params.greedy:
        generator = make_generator(0, target.device)
    eos = set(target.eos_token_ids) if stop_on_eos else set()
    model, dev = target.model, target.device
    t0 = time.perf_counter()
    cache = decoding_cache(model, len(prompt_ids) + max_new_tokens + spec.num_draft_tokens + spec.num_steps + spec.lookup)
    rows = pass_rows(model, cache)  # every pass runs on this multiple of tokens (`target.passes`)
    no_tree = tree_unsupported(target, cache) if use_tree or spec.lookup else None  # why a tree pass cannot run
    fallback = no_tree if use_tree else None
    if fallback:
        use_tree = False
    # context lookup (`decode.lookup`): greedy rounds only; a copied branch off a chain needs a tree pass
    index = NgramIndex(prompt_ids) if spec.lookup and params.greedy else None
    copies = {"rounds": 0, "tokens": 0, "accepted": 0, "alone": 0}  # "alone": rounds of copied tokens and no draft
    if isinstance(draft, Eagle3Draft):
        budget = spec.num_draft_tokens if use_tree else spec.num_steps
        proposer = EagleProposer(draft, capacity=len(prompt_ids) + max_new_tokens + spec.num_steps * spec.topk + budget + 8)
    else:
        proposer = draft
    hs_ids = list(proposer.hs_ids)
    stats = _Stats(spec.num_steps)
    fixed = fixed_budget(spec, use_tree)
    auto = AutoBudget(target, draft, spec, use_tree) if spec.budget == "auto" and isinstance(draft, Eagle3Draft) else None
    lookup = auto.lookup if auto else LookupModel()
    plain_steps = 0
    draft_s = verify_s = plain_s = 0.0
    out: list[int] = []
    stop = "length"

    def emit(tokens: list[int]) -> bool:
        nonlocal stop
        for tok in tokens:
            out.append(tok)
            if index is not None:
                index.extend((tok,))
            if on_token:
                on_token(tok)
            if tok in eos:
                stop = "eos"
                return True
            if len(out) >= max_new_tokens:
                return True
        return False

    with capture_hooks(target.parts, hs_ids) as store:
        def fused(rows: torch.Tensor | int) -> torch.Tensor | None:
            """The fused states of the last pass's rows `rows` (indices, or the first `rows`; filler rows follow)."""
            if not hs_ids:
                return None
            g = torch.cat([store[i] for i in hs_ids], dim=-1)[0]  # shape: [T + filler, n*H]
            return g[:rows] if isinstance(rows, int) else g[rows]

        tv = time.perf_counter()
        ids = torch.tensor([prompt_ids], device=dev)
        logits = padded_pass(model, ids, cache, rows, logits_to_keep=1)[0, -1]
        root = next_token(logits, params, generator)
        states, past = fused(len(prompt_ids)), 0
        tokens = torch.cat([ids[0, 1:], root.reshape(1)])  # shape: [n], the token after each prompt position
        done = emit([int(root)])
        verify_s += time.perf_counter() - tv
        while not done:
            td = time.perf_counter()
            budget = auto.next() if auto else fixed
            # tokens copied from the context for this round (`decode.lookup`), if any
            proposal = index.propose(min(spec.lookup, max_new_tokens - len(out) - 1)) if index is not None else []
            if budget.num_steps == 0:  # auto found no speculation that pays: a plain step, or copied tokens alone
                copied = _copy_branch(root_only(root), proposal, auto, budget, trees=False) if proposal else None
                cached = cache.get_seq_length()  # (not `past`: that is where the draft reads from next)
                run = copied.tree.tokens if copied else root.reshape(1)  # shape: [T], a chain
                logits = padded_pass(model, run[None], cache, rows)[0]  # shape: [T, V]
                synchronize(dev)
                auto.observe_pass(run.shape[0], 1000 * (time.perf_counter() - td))
                if copied:
                    res = verify_greedy(copied.tree, greedy_token(logits))
                    keep_accepted(cache, cached, [0] + res.accepted)
                    new, kept = res.tokens, 1 + res.num_accepted
                    _count_copies(copies, copied, res, 0)
                    auto.observe_lookup(copied, res.accepted)
                else:
                    new, kept = [int(next_token(logits[-1], params, generator))], 1
                # the draft reads these positions when auto speculates again
                states = torch.cat([states, fused(kept)])
                tokens = torch.cat([tokens, torch.tensor(new, device=dev)])
                root = tokens[-1]
                plain_steps += 1
                plain_s += time.perf_counter() - td
                done = emit(new)
                continue
            steps = min(budget.num_steps, max_new_tokens - len(out) - 1)
            round_spec = SpecConfig(num_steps=budget.num_steps, topk=max(1, budget.topk),
                                    num_draft_tokens=max(1, budget.num_draft_tokens or budget.num_steps),
                                    tree=not budget.is_chain, budget="fixed")
            backlog = tokens.shape[0]  # positions the draft reads first: 1 + accepted, more after a prompt or plain steps
            dtree = proposer.propose(states, tokens, past, steps=steps, spec=round_spec, tree=not budget.is_chain,
                                     params=params, generator=generator)
            base = dtree
            copied = _copy_branch(dtree, proposal, auto, budget, trees=not no_tree) if proposal else None
            dtree = copied.tree if copied else dtree
            tv = time.perf_counter()
            draft_s += tv - td
            past = cache.get_seq_length()
            if dtree.is_chain:
                mask, positions = None, None
            else:
                mask, positions = target_tree_mask(dtree, past, target), (dtree.positions() + past)[None]
            tf = time.perf_counter()
            logits = padded_pass(model, dtree.tokens[None], cache, rows, mask=mask,
                                 positions=positions)[0]  # shape: [N+1, V]
            if auto:
                synchronize(dev)
                auto.observe_pass(dtree.size, 1000 * (time.perf_counter() - tf))
            if params.greedy:
                res = verify_greedy(dtree, greedy_token(logits))
            else:
                p = logits_to_probs(logits, params)  # shape: [N+1, V]
                if dtree.is_chain and dtree.q is not None:
                    res = verify_chain_sampled(dtree.tokens[1:], p, dtree.q[1:], generator)
                else:
                    res = verify_tree_sampled(dtree, p, generator)
            keep = [0] + res.accepted
            keep_accepted(cache, past, keep)
            states = fused(torch.tensor(keep, device=dev))  # shape: [m+1, n*H], positions past..past+m
            tokens = torch.tensor(res.tokens, device=dev)  # the token after each kept position
            root = tokens[-1]
            drafted = sum(1 for node in res.accepted if node < base.size)  # the draft's tokens among those accepted
            stats.add(base, drafted, len(res.tokens))
            if copied:
                _count_copies(copies, copied, res, drafted)
                if auto:
                    auto.observe_lookup(copied, res.accepted)
                else:
                    lookup.observe(copied.path, res.accepted)
            verify_s += time.perf_counter() - tv
            if auto and base.size > 1:
                extra_ms = auto.cost.target(dtree.size) - auto.cost.target(base.size)  # the copied rows, not overhead
                auto.observe(budget, base.max_depth, drafted,
                             1000 * (time.perf_counter() - td) - extra_ms if backlog <= budget.num_steps + 1 else None)
            done = emit(res.tokens)
    seconds = time.perf_counter() - t0
    passes = stats.passes
    extra = {
        "accept_length": stats.produced / passes if passes else 0.0,
        "accept_per_position": [a / r if r else 0.0 for a, r in zip(stats.accept, stats.reach)],
        "accept_counts": stats.accept,
        "reach_counts": stats.reach,
        "draft_s": draft_s,
        "verify_s": verify_s,
        "plain_s": plain_s,
        "other_s": max(0.0, seconds - draft_s - verify_s - plain_s),
        "target_forwards": 1 + passes + plain_steps,
        "num_verify_passes": passes,
        "tree": use_tree,
        "tree_fallback": fallback,
        "spec": spec.to_dict(),
        "budget": spec.budget if auto else "fixed",
        "budget_used": auto.report() if auto else {"budgets_used": {fixed.label(): passes}},
        "plain_steps": plain_steps,
        "lookup": {**copies, "max": spec.lookup if index is not None else 0, "rates": lookup.report()},
    }
    return GenerationResult(list(prompt_ids), out, stop, seconds, 1 + passes + plain_steps, extra)

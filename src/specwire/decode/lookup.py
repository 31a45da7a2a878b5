"""Context lookup: draft tokens copied from the request's own text, grafted onto the EAGLE-3 tree.

Scope: `NgramIndex` (the continuation of the text's last n-gram where it occurred before), `follow` and `graft`
(a proposed token sequence merged into a `DraftTree` as one more branch), `LookupModel` (how often a copied token is
accepted, per position along the copy, learnt live) and `tail_length` (how many copied tokens a round should
verify, by expected tokens per ms). Pure: no models, no clocks. The engine decides when to call them.

Why: a model's answer often repeats its context: code restates the signature and names it was given, an
extraction copies phrases of the document, a list repeats its own pattern. An EAGLE-3 draft predicts such text
no better than any other, while a lookup finds it for free: where the last `n` tokens occurred earlier in the
prompt or the answer, the tokens that followed them there are a good guess (prompt lookup decoding, Saxena 2023;
the n-gram proposers of vLLM and SGLang). The target's verify pass decides every token, so a copied branch
changes no output: the accepted path is the longest one that matches the target's greedy choice, whichever
branch it runs along. It costs only the extra rows of the pass, which cost little where a pass's cost grows slowly with
its rows (bf16 on AMX or AVX512-BF16) and more in float32, so under `--budget auto` the branch is cut to the
length whose expected accepted tokens pay for its rows (`tail_length`).

Greedy decoding only: a sampled round's tree carries the draft's laws, which a copied token does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specwire.decode.tree import DraftTree

MIN_NGRAM = 2  # shortest suffix matched: one token repeats too often to predict what follows
MAX_NGRAM = 3  # longest suffix tried first: the most specific match
# A copied token's chance of acceptance given the copy's earlier tokens were accepted, by position along the copy:
# the prior before live rounds correct it. Measured on the built-in target's greedy answers (first 12 HumanEval and
# 16 MT-bench prompts): 0.72 and 0.69 at the first token, 0.85 and 0.68 at the second, 0.8 to 0.9 further on, as
# a copy that has started to hold tends to go on.
PRIOR_RATES = (0.6, 0.7, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8)
PRIOR_ROUNDS = 8  # weight of the prior, in rounds, against the live counts at each position


class NgramIndex:
    """Where each n-gram (MIN_NGRAM <= n <= MAX_NGRAM) of a growing token sequence last occurred with a token after
    it. `propose` looks up the sequence's own last n-gram, longest first, and copies what followed its latest
    earlier occurrence. Where that occurrence overlaps the end (a repeating pattern: "a b a b a b"), the copy runs
    on into the tokens it has copied, as an LZ77 match longer than its distance does, so a loop is proposed for
    its whole length rather than for the few tokens left before the end. O(1) a token to extend, O(limit) to
    propose."""

    def __init__(self, tokens: list[int] = (), *, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"NgramIndex: expected 1 <= min_n <= max_n, found {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, tokens) -> None:
        for tok in tokens:
            self.tokens.append(int(tok))
            end = len(self.tokens) - 1  # the n-grams that end just before this token now have a continuation
            for n in range(self.min_n, self.max_n + 1):
                if end >= n:
                    self._next[tuple(self.tokens[end - n:end])] = end

    def propose(self, limit: int) -> list[int]:
        """`limit` tokens copied from after the latest earlier occurrence of the sequence's last n-gram (the longest
        n that occurred before), continuing into the copy where the sequence ends; [] where none occurred."""
        if limit <= 0:
            return []
        text = self.tokens
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(text) < n:
                continue
            start = self._next.get(tuple(text[-n:]))
            if start is not None:
                out = text[start:start + limit]
                while len(out) < limit:  # past the end: the copy continues from what it copied (start < len(text))
                    out.append(out[start + len(out) - len(text)])
                return out
        return []


@dataclass(frozen=True)
class Graft:
    """A proposal grafted onto a tree: `path` [len(proposal)] holds the node of each proposed token, `shared` of
    them (the first) were already in the tree, the rest were appended as one branch after its `base` nodes."""

    tree: DraftTree
    path: list[int]
    shared: int
    base: int  # nodes of the tree before the graft (root included): nodes >= base are copied tokens

    @property
    def added(self) -> int:
        return len(self.path) - self.shared


def follow(tree: DraftTree, proposal: list[int]) -> list[int]:
    """The tree's nodes that spell the longest prefix of `proposal` from the root (the part already in the tree)."""
    tokens = tree.tokens.tolist()
    node, path = 0, []
    for tok in proposal:
        child = next((c for c in tree.children[node] if tokens[c] == tok), None)
        if child is None:
            break
        node = child
        path.append(node)
    return path


def graft(tree: DraftTree, proposal: list[int], shared: list[int] | None = None) -> Graft:
    """`tree` with `proposal` (target ids, the tokens after the root) as a branch from the root: the proposal
    follows the tree's nodes while they match it (`shared`, if the caller has `follow`ed them already), then
    continues as a chain of new nodes appended after the tree's (so parents still precede children, and the
    tree's own node indices do not change). The tree must be greedy (q None): a copied token has no draft law."""
    if tree.q is not None:
        raise ValueError("graft: a sampled tree's nodes carry draft laws; copied tokens have none")
    path = list(follow(tree, proposal) if shared is None else shared)
    rest = [int(t) for t in proposal[len(path):]]
    if not rest:
        return Graft(tree, path, len(path), tree.size)
    shared_count, node = len(path), path[-1] if path else 0
    parents = list(tree.parents)
    for tok in rest:
        parents.append(node)
        node = len(parents) - 1
        path.append(node)
    new = torch.tensor(rest, dtype=tree.tokens.dtype, device=tree.device)
    return Graft(DraftTree(tokens=torch.cat([tree.tokens, new]), parents=parents), path, shared_count, tree.size)


@dataclass
class LookupModel:
    """How often a copied token is accepted, per position along the copy (given the copy's earlier tokens were):
    PRIOR_RATES corrected by live counts."""

    prior: tuple[float, ...] = PRIOR_RATES
    live: list[list[float]] = field(default_factory=list)  # per position: [rounds that reached it, that accepted it]

    def rates(self, n: int) -> list[float]:
        """The first `n` positions' acceptance (past the prior's length, its last rate)."""
        out = []
        for j in range(n):
            p = self.prior[min(j, len(self.prior) - 1)]
            reached, accepted = self.live[j] if j < len(self.live) else (0, 0)
            out.append((p * PRIOR_ROUNDS + accepted) / (PRIOR_ROUNDS + reached))
        return out

    def observe(self, path: list[int], accepted: list[int]) -> None:
        """One verified round: `path`, the nodes of the copied tokens that were in the pass; `accepted`, the nodes
        the target accepted (root to leaf). Position j is reached if the copy's first j tokens were accepted."""
        taken = set(accepted)
        while len(self.live) < len(path):
            self.live.append([0, 0])
        for j, node in enumerate(path):
            self.live[j][0] += 1
            if node not in taken:
                return
            self.live[j][1] += 1

    def carried(self, limit: float) -> list[list[float]]:
        """The live counts to start the next request from: each position's scaled down to at most `limit` rounds
        reached, so the newest rounds keep moving the rates."""
        return [[r * min(1.0, limit / r), a * min(1.0, limit / r)] if r else [0, 0] for r, a in self.live]

    def report(self) -> list[float]:
        return [round(r, 3) for r in self.rates(len(self.live))]


def expected_copied(rates: list[float], shared: int, tail: int) -> float:
    """Copied tokens the target is expected to accept beyond the `shared` ones already in the tree, if `tail` more
    are verified: sum over k in shared..shared+tail-1 of rates[0] ... rates[k]."""
    total, run = 0.0, 1.0
    for k in range(shared + tail):
        run *= rates[k]
        if k >= shared:
            total += run
    return total


def tail_length(rates: list[float], shared: int, available: int, round_tokens: float, round_ms: float,
                extra_ms: Callable[[int], float]) -> int:
    """How many of the `available` copied tokens past the tree to verify (0..available): the number that gives the
    round the most expected tokens per ms, (round_tokens + expected_copied) / (round_ms + extra_ms(tail)), where
    `round_tokens` and `round_ms` are the round's without the copy and `extra_ms(t)` what t more rows add to the
    verify pass. Ties go to the shorter tail. `rates` covers at least shared + available positions."""
    best, best_rate = 0, round_tokens / round_ms if round_ms > 0 else 0.0
    for t in range(1, available + 1):
        ms = round_ms + extra_ms(t)
        rate = (round_tokens + expected_copied(rates, shared, t)) / ms if ms > 0 else 0.0
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = t, rate
    return best

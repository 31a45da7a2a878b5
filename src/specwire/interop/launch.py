"""Checked launch command lines for SGLang and vLLM.

Owns: `launch_command` (the argv for `python -m sglang.launch_server` or `vllm serve` with a draft)
and the pure flag rules it enforces (`sglang_max_draft_tokens`, `check_sglang_flags`); the
`launch-cmd` subcommand is `specwire.cli.launch`. The draft is opened with the one reader
(`draft.reader`), so its consistency check runs first. Every check that would otherwise fail silently inside the engine is made
here first: the checkpoint layout the engine loads, the layer ids as that engine reads them against
the draft's Wiring, SGLang's topk=1 override, the size of the draft tree, max_position_embeddings,
vocabulary and hidden sizes. Does not convert checkpoints (`interop.convert`) and never runs an engine.
Engine facts are "true for the versions read" (`docs/CONVENTIONS.md` sections 3 and 5).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from specwire.draft.checkpoint import resolve_draft_path
from specwire.errors import SpecwireError
from specwire.draft.reader import FORMAT_SGLANG, read_checkpoint
from specwire.interop.engines import ENGINES, engine_reading
from specwire.interop.sglang import SGLANG_NUM_FUSED
from specwire.wiring import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS

SGLANG_DEFAULTS = {"num_steps": 5, "topk": 4, "num_draft_tokens": 16}
# SGLang's and vLLM's EAGLE-3 Llama drafts both build fc as Linear(3 * target_hidden_size, H).
ENGINE_NUM_FUSED = SGLANG_NUM_FUSED


# ---- SGLang flag rules (pure) ----------------------------------------------------------------------

def sglang_max_draft_tokens(num_steps: int, topk: int) -> int:
    """Most tokens SGLang's EAGLE tree can verify in one pass, bonus root included.

    SGLang's draft keeps `topk` candidates after step 0 and `topk * topk` after each later step
    (`organize_draft_results` scores topk + (num_steps - 1) * topk**2 nodes) and verifies the best
    num_draft_tokens - 1 of them plus the root; asking for more fails in its torch.topk.
    """
    return 1 + topk + (num_steps - 1) * topk * topk


def check_sglang_flags(num_steps: int, topk: int, num_draft_tokens: int) -> list[str]:
    """Refuse flag combinations that SGLang overrides silently or cannot build; return what was checked."""
    for name, v in (("--num-steps", num_steps), ("--topk", topk), ("--num-draft-tokens", num_draft_tokens)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SpecwireError(f"{name} must be a positive integer, found {v!r}.")
    if topk == 1 and num_draft_tokens != num_steps + 1:
        raise SpecwireError(
            f"--topk 1 with --num-draft-tokens {num_draft_tokens}: with topk 1 the draft is a chain of {num_steps} tokens, "
            f"and SGLang silently overrides num-draft-tokens to num-steps + 1 = {num_steps + 1} (only a log warning), so the "
            "setting you asked for would not be the one served.",
            fix=f"pass --num-draft-tokens {num_steps + 1}, or --topk 2 (or more) for a tree.",
        )
    if num_draft_tokens < 2:
        raise SpecwireError(f"--num-draft-tokens {num_draft_tokens}: SGLang verifies the root plus at least one draft token (>= 2).")
    most = sglang_max_draft_tokens(num_steps, topk)
    if num_draft_tokens > most:
        raise SpecwireError(
            f"--num-draft-tokens {num_draft_tokens} is more than a tree of {num_steps} steps with topk {topk} can hold: "
            f"1 + topk + (num_steps - 1) * topk^2 = {most}.",
            fix=f"pass --num-draft-tokens {most} or less, or more --num-steps / --topk.",
        )
    return [
        f"SGLang tree: {num_steps} steps x topk {topk} holds up to {most} draft tokens; {num_draft_tokens} requested",
        "topk=1 override: not triggered" if topk > 1 else f"topk=1: num-draft-tokens = num-steps + 1 = {num_draft_tokens}",
    ]


# ---- the command ---------------------------------------------------------------------------------

@dataclass
class LaunchCommand:
    engine: str
    argv: list[str]
    checks: list[str] = field(default_factory=list)  # what was verified, in words
    notes: list[str] = field(default_factory=list)  # things to know that are not refusals

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "argv": list(self.argv), "command": self.command, "checks": list(self.checks),
                "notes": list(self.notes)}


def launch_command(draft: str, *, engine: str, target: str = "smollm2-135m", num_steps: int | None = None,
                   topk: int | None = None, num_draft_tokens: int | None = None, tp: int = 1, port: int | None = None,
                   sglang_version: str | None = None) -> LaunchCommand:
    """A launch line for `engine` serving `target` with `draft`, after every check this module knows."""
    from specwire.target.load import resolve_target_path, target_info

    if engine not in ENGINES:
        raise SpecwireError(f"unknown engine '{engine}'; expected one of {list(ENGINES)}.")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise SpecwireError(f"--tp must be a positive integer, found {tp!r}.")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise SpecwireError(f"--port must be 1..65535, found {port!r}.")
    checks: list[str] = []
    notes: list[str] = []
    dpath = resolve_draft_path(draft)
    info = read_checkpoint(dpath).require_consistent()
    if info.format is None:
        raise SpecwireError(f"cannot tell the format of draft '{dpath}': " + " ".join(info.problems))

    # 1. the layout the engine loads
    if engine == "sglang" and info.layout != "midlayer":
        raise SpecwireError(
            f"draft '{dpath}' uses the {info.format} layout (layers.0.* tensor names); SGLang silently skips tensor names it "
            "does not know and would serve a randomly initialised draft layer with no error.",
            fix=f"export it: specwire export {draft} --format sglang --out DIR",
        )
    if engine == "vllm" and info.format == FORMAT_SGLANG:
        raise SpecwireError(
            f"draft '{dpath}' is in SGLang's layout: its eagle_config ids are SGLang layer-output ids, which vLLM versions "
            "read differently (or ignore for their default), and it has no speculators config.",
            fix="serve the native checkpoint, or export one: specwire export NATIVE_DRAFT --format speculators --out DIR",
        )
    checks.append(f"format: {info.format} layout ({info.layout}.* tensor names) is what {engine} loads")

    # 2. the draft's own wiring
    config = info.draft_config()
    if config is None:
        raise SpecwireError(
            f"draft '{dpath}' has no specwire block, so its wiring (the states it was trained on) is unknown and "
            "cannot be checked against the engine.",
            fix=f"import it with its target first: specwire import {dpath} --out DIR --target TARGET, then export.",
        )
    w = config.wiring

    # 3. the target
    tinfo = target_info(target)
    tpath = str(resolve_target_path(target))
    for name, mine, theirs in (("architecture", w.target.architecture, tinfo.architecture),
                               ("num_layers", w.target.num_layers, tinfo.num_layers),
                               ("hidden_size", w.target.hidden_size, tinfo.hidden_size),
                               ("vocab_size", w.target.vocab_size, tinfo.vocab_size)):
        if mine != theirs:
            raise SpecwireError(
                f"the draft was trained for a target with {name} {mine}; '{target}' has {theirs}.",
                fix="pass the target the draft was trained for (see the draft's config.json, specwire.draft_config.wiring.target).",
            )
    checks.append(f"target: {tinfo.architecture}, {tinfo.num_layers} layers, hidden {tinfo.hidden_size}, vocab "
                  f"{tinfo.vocab_size} match the draft's wiring (fingerprint not checked: config only)")
    if config.vocab_size != tinfo.vocab_size:
        raise SpecwireError(f"draft vocab_size {config.vocab_size} (t2d length, embedding rows) differs from the target's {tinfo.vocab_size}.")
    if config.target_hidden_size != tinfo.hidden_size:
        raise SpecwireError(f"draft target_hidden_size {config.target_hidden_size} differs from the target's hidden size {tinfo.hidden_size}.")
    if config.hidden_size != tinfo.hidden_size:
        raise SpecwireError(
            f"draft hidden_size {config.hidden_size} differs from the target's {tinfo.hidden_size}; the draft shares the "
            "target's token embedding, which has the target's width.")
    checks.append(f"sizes: vocab {config.vocab_size} (draft vocab {config.draft_vocab_size}), hidden {config.hidden_size}, "
                  f"fc input {config.num_fused} x {config.target_hidden_size} fit the target")
    if tinfo.max_position_embeddings is not None and config.max_position_embeddings < tinfo.max_position_embeddings:
        raise SpecwireError(
            f"draft max_position_embeddings {config.max_position_embeddings} is smaller than the target's "
            f"{tinfo.max_position_embeddings}; engines size the draft's rope and KV cache by it and acceptance collapses "
            "on long contexts (SpecForge reports near-zero acceptance).",
            fix=f"re-export from the native checkpoint: specwire export NATIVE_DRAFT --format FORMAT --max-position-embeddings {tinfo.max_position_embeddings} --out DIR",
        )
    checks.append(f"max_position_embeddings: draft {config.max_position_embeddings} >= target {tinfo.max_position_embeddings}")
    if config.num_attention_heads % tp or (config.num_key_value_heads % tp and tp % config.num_key_value_heads):
        raise SpecwireError(f"--tp {tp}: the draft's {config.num_attention_heads} attention heads / {config.num_key_value_heads} "
                            "KV heads cannot be split over that many GPUs.")

    # 4. the layer ids as this engine reads them
    L = tinfo.num_layers
    if engine == "sglang":
        written_for = (info.specwire or {}).get("sglang_version", DEFAULT_SGLANG_VERSION)
        version = sglang_version or written_for
        if version not in SGLANG_VERSIONS:
            raise SpecwireError(f"unknown SGLang version rule '{version}'; expected one of {list(SGLANG_VERSIONS)}.")
    else:
        version = DEFAULT_SGLANG_VERSION
    if config.num_fused != ENGINE_NUM_FUSED:
        raise SpecwireError(
            f"the draft fuses {config.num_fused} target states; {engine}'s EAGLE-3 Llama draft builds fc for exactly "
            f"{ENGINE_NUM_FUSED} (fc input = 3 x target hidden size), so its weights would not load.",
            fix="retrain with three hidden-state ids (specwire's default wiring).")
    checks.append(f"fused states: {config.num_fused}, as {engine}'s fc expects")
    reading = engine_reading(info, engine, L, sglang_version=version)
    if reading.hs_ids is None or tuple(reading.hs_ids) != tuple(w.hs_ids):
        fix = (f"re-export for this SGLang: specwire export NATIVE_DRAFT --format sglang --sglang-version {version} --out DIR"
               if engine == "sglang" else "re-export: specwire export NATIVE_DRAFT --format speculators --out DIR")
        raise SpecwireError(
            f"{engine} would feed the draft hs {list(reading.hs_ids) if reading.hs_ids else 'unknown'} ({reading.ids_source}); "
            f"it was trained on hs {list(w.hs_ids)}. Acceptance would collapse without any error.", fix=fix)
    checks.append(f"layer ids: {reading.ids_source} -> hs {list(reading.hs_ids)} = the draft's wiring")
    if engine == "sglang" and 0 in w.hs_ids:
        raise SpecwireError("the wiring includes hs 0 (the embedding output, SGLang id -1), which stock SGLang cannot capture.",
                            fix="serve it with vLLM, or with an SGLang whose target model is patched to capture the embeddings.")
    if reading.norm_before_residual != config.norm_before_residual:
        raise SpecwireError(
            f"{engine} would run the draft layer with norm_before_residual={reading.norm_before_residual}; it was trained with "
            f"{config.norm_before_residual}.", fix="re-export from the native checkpoint (norm_before_residual is written explicitly).")
    checks.append(f"norm_before_residual: {engine} runs {reading.norm_before_residual}, as trained")
    if config.draft_vocab_size < config.vocab_size and not {"d2t", "t2d"} <= set(info.tensors):
        raise SpecwireError(f"draft '{dpath}' has a {config.draft_vocab_size}-token vocabulary but no d2t/t2d tensors; "
                            f"{engine} would treat draft ids as target ids.", fix="re-export from the native checkpoint.")
    checks.append("vocab map: d2t and t2d present" if "d2t" in info.tensors else "vocab map: shared vocabulary")
    notes.extend(reading.notes)

    # 5. flags
    if engine == "sglang":
        steps = num_steps if num_steps is not None else SGLANG_DEFAULTS["num_steps"]
        k = topk if topk is not None else SGLANG_DEFAULTS["topk"]
        if num_draft_tokens is not None:
            m = num_draft_tokens
        elif k == 1:
            m = steps + 1
        else:
            m = min(SGLANG_DEFAULTS["num_draft_tokens"], sglang_max_draft_tokens(steps, k))
        checks += check_sglang_flags(steps, k, m)
        argv = ["python", "-m", "sglang.launch_server", "--model-path", tpath, "--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", str(dpath), "--speculative-num-steps", str(steps),
                "--speculative-eagle-topk", str(k), "--speculative-num-draft-tokens", str(m), "--tp-size", str(tp)]
    else:
        if topk not in (None, 1) or num_draft_tokens is not None:
            raise SpecwireError("--topk and --num-draft-tokens are SGLang tree flags; vLLM's eagle3 drafts a chain of "
                                "--num-steps tokens (num_speculative_tokens).", fix="drop them, or use --engine sglang.")
        steps = num_steps if num_steps is not None else SGLANG_DEFAULTS["num_steps"]
        if not isinstance(steps, int) or steps < 1:
            raise SpecwireError(f"--num-steps must be a positive integer, found {steps!r}.")
        spec = {"method": "eagle3", "model": str(dpath), "num_speculative_tokens": steps}
        argv = ["vllm", "serve", tpath, "--speculative-config", json.dumps(spec), "--tensor-parallel-size", str(tp)]
        checks.append(f"vLLM speculative config: eagle3, {steps} speculative tokens")
    if port is not None:
        argv += ["--port", str(port)]
    return LaunchCommand(engine=engine, argv=argv, checks=checks, notes=notes)

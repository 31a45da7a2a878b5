"""Plain KV-cached decoding of the target: the oracle and the baseline.

Owns: one-request autoregressive decoding with the target's own KV cache, greedy or sampled through
`sampling`. Speculative decoding is tested token-for-token against this loop (greedy) and measured
against it (speed). Knows nothing about drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specwire.errors import SpecwireError
from specwire.decode.sampling import SamplingParams, make_generator, next_token
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows
from specwire.target.load import Target


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens only (EOS included when hit)
    stop_reason: str  # "eos" | "length"
    seconds: float
    target_forwards: int  # number of target passes, prefill included
    extra: dict = field(default_factory=dict)  # method-specific metrics (speculative engines fill this)

    @property
    def tokens_per_s(self) -> float:
        return len(self.output_ids) / self.seconds if self.seconds > 0 else float("nan")


def check_request(target: Target, prompt_ids: list[int], max_new_tokens: int) -> None:
    """Refuse empty prompts and requests past the target's context."""
    if not prompt_ids:
        raise SpecwireError("empty prompt: give at least one token of input.")
    if max_new_tokens < 1:
        raise SpecwireError(f"max-new-tokens must be >= 1, found {max_new_tokens}.")
    limit = target.info.max_position_embeddings
    if limit is not None and len(prompt_ids) + max_new_tokens > limit:
        raise SpecwireError(
            f"prompt ({len(prompt_ids)} tokens) + max-new-tokens ({max_new_tokens}) exceeds the target's context "
            f"of {limit} positions (max_position_embeddings).",
            fix=f"use --max-new-tokens {max(1, limit - len(prompt_ids))} or a shorter prompt.",
        )


@torch.inference_mode()
def plain_generate(
    target: Target,
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 128,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    on_token: Callable[[int], None] | None = None,
    stop_on_eos: bool = True,
) -> GenerationResult:
    """Decode up to `max_new_tokens` tokens, one target pass per token after the prefill."""
    check_request(target, prompt_ids, max_new_tokens)
    if generator is None and not params.greedy:
        generator = make_generator(0, target.device)
    eos = set(target.eos_token_ids) if stop_on_eos else set()
    model = target.model
    t0 = time.perf_counter()
    cache = decoding_cache(model, len(prompt_ids) + max_new_tokens)
    rows = pass_rows(model, cache)  # every pass runs on this multiple of tokens (`target.passes`)
    ids = torch.tensor([prompt_ids], device=target.device)
    out: list[int] = []
    forwards = 0
    stop = "length"
    while len(out) < max_new_tokens:
        logits = padded_pass(model, ids, cache, rows, logits_to_keep=1)[:, -1]
        forwards += 1
        tok = int(next_token(logits[0], params, generator))
        out.append(tok)
        if on_token:
            on_token(tok)
        if tok in eos:
            stop = "eos"
            break
        ids = torch.tensor([[tok]], device=target.device)
    return GenerationResult(list(prompt_ids), out, stop, time.perf_counter() - t0, forwards)

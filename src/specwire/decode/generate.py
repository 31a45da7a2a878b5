"""One reply to one prompt, end to end: `specwire generate` and the demo's streamed answers.

Owns: `GenerateConfig` (what one generation asks for), choosing plain or speculative decoding (a draft
given or not), and streaming the reply's text as it is decoded (`decode.text.TextStream`). Does not own
the decoding loops (`decode.plain`, `decode.engine`), loading models (`target.load`, the engine's
draft loader), or how the text reaches a user (the command line prints the pieces).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
from specwire.decode.plain import GenerationResult, plain_generate
from specwire.decode.sampling import SamplingParams, make_generator
from specwire.decode.text import TextStream
from specwire.errors import SpecwireError
from specwire.decode.kernels import kernel_of, load_decoding_target
from specwire.target.load import BUILTIN_TARGET, Target


@dataclass
class GenerateConfig:
    """One generation: the prompt, the models, and how to decode."""

    prompt: str  # user message
    target: str = BUILTIN_TARGET  # built-in target name or HF model folder
    draft: str | None = None  # draft folder or 'smollm2-135m-eagle3' (default: plain decoding)
    max_new_tokens: int = 128  # new tokens at most
    sampling: SamplingParams = field(default_factory=SamplingParams)  # temperature, top-k, top-p (default: greedy)
    seed: int = 0  # seed of the sampling generator
    raw: bool = False  # do not apply the chat template
    spec: SpecConfig = field(default_factory=SpecConfig)  # speculation, with a draft
    device: str | None = None  # torch device (None: cuda when available, else cpu)
    dtype: str = "auto"  # weights dtype ("auto": the fastest batch-invariant on this machine)
    linear: str = "auto"  # the target's linear layers ("auto", "torch", "pretransposed", "onednn", "rowdot" or "amx")

    def __post_init__(self):
        if not isinstance(self.prompt, str):
            raise SpecwireError(f"GenerateConfig.prompt: expected a string, found {type(self.prompt).__name__}.")
        if not isinstance(self.sampling, SamplingParams) or not isinstance(self.spec, SpecConfig):
            raise SpecwireError("GenerateConfig: `sampling` must be a SamplingParams and `spec` a SpecConfig.")


@dataclass
class Reply:
    """A decoded reply: its text (exactly the pieces streamed, joined) and the decoding's result."""

    text: str
    result: GenerationResult


def decode_reply(target: Target, draft, prompt_ids: list[int], *, max_new_tokens: int,
                 params: SamplingParams = SamplingParams(), generator: torch.Generator | None = None,
                 spec: SpecConfig | None = None, on_text: Callable[[str], None] | None = None) -> Reply:
    """Decode a reply to `prompt_ids`, speculatively with `draft` (`spec`'s knobs and tree/chain) or plainly
    without; `on_text` gets each piece of text as soon as it is final."""
    stream = TextStream.for_tokenizer(target.tokenizer)

    def on_token(token_id: int) -> None:
        piece = stream.add(token_id)
        if piece and on_text:
            on_text(piece)

    if draft is not None:
        spec = spec or SpecConfig()
        res = speculative_generate(target, draft, prompt_ids, max_new_tokens=max_new_tokens, params=params,
                                   generator=generator, tree=spec.tree, spec=spec, on_token=on_token)
    else:
        res = plain_generate(target, prompt_ids, max_new_tokens=max_new_tokens, params=params, generator=generator,
                             on_token=on_token)
    rest = stream.finish()
    if rest and on_text:
        on_text(rest)
    res.extra["dtype"] = str(target.dtype).replace("torch.", "")
    res.extra["kernel"] = kernel_of(target).name  # dtype/linear: what `--dtype auto --linear auto` resolved to
    return Reply(stream.text, res)


def generate_reply(config: GenerateConfig, *, on_text: Callable[[str], None] | None = None,
                   target: Target | None = None, draft=None) -> Reply:
    """Load the target (and the draft, when `config.draft` names one) unless given, then decode one reply."""
    if target is None:
        target = load_decoding_target(config.target, device=config.device, dtype=config.dtype, linear=config.linear)
    if draft is None and config.draft:
        draft = load_engine_draft(config.draft, target)
    prompt_ids = target.tokenizer(config.prompt)["input_ids"] if config.raw else target.encode_chat(config.prompt)
    return decode_reply(target, draft, prompt_ids, max_new_tokens=config.max_new_tokens, params=config.sampling,
                        generator=make_generator(config.seed, target.device), spec=config.spec, on_text=on_text)

"""Bitwise batch invariance: every row of a chain or tree verify pass equals single-step decoding.

On tiny models of every supported architecture, in fp32 and bf16, and (slow) on the built-in target,
with nn.Linear, oneDNN's prepacked kernel (bf16), the compiled rowdot kernel (fp32, and bf16 through `bf16dot`) and (slow; `test_amx` for
tiny models) the AMX kernel (bf16), with the compiled attention and its torch form,
through `decode.invariance.pass_invariance`: random prompts, chain and random-tree passes of every size
up to 17 (a root plus 16 draft tokens), each row compared bitwise with decoding its path one token at a
time from the same cache. The negative control shows the check can fail: transformers' sdpa attention
is not invariant on the built-in target in bf16.
"""

from __future__ import annotations

import pytest
import torch

from helpers import ARCHS, prompt_of
from specwire.decode.invariance import pass_invariance
from specwire.target import amx
from specwire.target.attention import use_invariant_attention
from specwire.target.load import load_target

SIZES = (1, 2, 3, 5, 8, 16, 17)


@pytest.mark.parametrize("dtype,linear,attention", [
    ("float32", "torch", "auto"), ("bfloat16", "torch", "auto"), ("float32", "rowdot", "auto"), ("bfloat16", "onednn", "auto"),
    ("bfloat16", "rowdot", "auto"), ("float32", "torch", "torch"), ("bfloat16", "torch", "torch")])
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_passes_are_bitwise_single_steps(tiny_target, arch, dtype, linear, attention):
    """attention "auto": the compiled kernel (`rowattn.c`; this machine builds it, `test_rowattn` checks so);
    "torch": the torch form, the one CUDA and CPUs without the kernel run."""
    target = load_target(tiny_target(arch), device="cpu", dtype=dtype, linear=linear)
    use_invariant_attention(target.model, attention)
    prompts = [prompt_of(n, seed=n) for n in (5, 37, 70)]  # the last one crosses a 64-key chunk boundary
    rep = pass_invariance(target, prompts, sizes=SIZES, seed=1)
    assert rep.ok, f"{arch} {dtype}: {rep.equal}/{rep.rows} rows equal; first failures {rep.failures[:5]}"
    assert rep.rows >= 3 * 2 * len(SIZES)


def test_sliding_window_prefix_falls_back_without_error(tiny_target):
    """A windowed prefix is outside the invariance contract: it must still decode (through sdpa)."""
    from specwire.target.attention import invariant_attention, torch_invariant_attention

    q = torch.randn(1, 4, 3, 16)
    k = torch.randn(1, 2, 10, 16)
    mask = torch.ones(1, 1, 3, 10, dtype=torch.bool)
    mask[..., 0] = False  # the first key is out of the window
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True  # what transformers' attention modules carry
    for fn in (invariant_attention, torch_invariant_attention):
        out, _ = fn(module, q, k, k.clone(), mask, scaling=0.25)
        assert out.shape == (1, 3, 4, 16) and torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype,linear", [("float32", "torch"), ("bfloat16", "torch"), ("float32", "rowdot"),
                                          ("bfloat16", "onednn"), ("bfloat16", "rowdot"), ("bfloat16", "amx")])
def test_builtin_target_passes_are_bitwise_single_steps(dtype, linear):
    if linear == "amx" and amx.cpu_lacks():
        pytest.skip(f"this CPU has no AMX: {amx.cpu_lacks()}")
    target = load_target("smollm2-135m", device="cpu", dtype=dtype, linear=linear)
    prompts = [target.encode_chat("Write a short poem about the sea and the wind."),
               target.encode_chat("def fib(n):\n    '''Return the n-th Fibonacci number.'''\n" * 3)]
    rep = pass_invariance(target, prompts, sizes=(1, 2, 6, 16, 17))
    assert rep.ok, f"{dtype}/{linear}: {rep.equal}/{rep.rows}; {rep.failures[:5]}"


@pytest.mark.slow
def test_negative_control_sdpa_is_not_invariant_in_bf16():
    target = load_target("smollm2-135m", device="cpu", dtype="bfloat16", attention="sdpa")
    prompts = [target.encode_chat("Write a short poem about the sea and the wind.")]
    rep = pass_invariance(target, prompts, sizes=(6, 16), tree=False)
    assert not rep.ok and rep.equal < rep.rows

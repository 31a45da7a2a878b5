"""The compiled AMX bf16 product (`target.amx`, `--linear amx`).

Every row of a product is bitwise the row a one-row product gives, for every row count up to the invariance
contract's 64 and at every place among the rows, with and without bias, for shapes that do and do not fill
the kernel's tiles (the module pads them); the values are F.linear's in bf16 to rounding. Tiny models of every
supported architecture swapped to it give chain and tree passes bitwise equal to single steps, and
speculative decoding on them is token-identical to plain greedy decoding, and the hf-generate baseline runs
F.linear on them instead. Asking for it in float32 is
refused with the reason. On a CPU without AMX these tests skip with a reason on the allow-list.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import ARCHS, OracleProposer, make_draft_dir, make_tiny_target_dir, prompt_of
from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
from specwire.decode.invariance import pass_invariance
from specwire.decode.plain import plain_generate
from specwire.errors import SpecwireError
from specwire.target import amx
from specwire.target.fastlinear import AmxLinear, linear_kind
from specwire.target.load import load_target

# only a CPU without AMX may skip (allow-listed); a kernel that fails to build on an AMX CPU fails the tests
needs_amx = pytest.mark.skipif(amx.cpu_lacks() is not None, reason=f"this CPU has no AMX: {amx.cpu_lacks()}")


@needs_amx
@pytest.mark.parametrize("n,k,bias", [(96, 64, False), (48, 96, True), (37, 100, True), (1536, 576, False)])
def test_rows_are_bitwise_independent_of_the_rows_beside_them(n, k, bias):
    g = torch.Generator().manual_seed(n * k)
    lin = nn.Linear(k, n, bias=bias).to(torch.bfloat16).requires_grad_(False)
    lin.weight.copy_(torch.randn(n, k, generator=g))
    if bias:
        lin.bias.copy_(torch.randn(n, generator=g))
    layer = AmxLinear(lin)
    x = (torch.randn(70, k, generator=g) * 3).to(torch.bfloat16)
    with torch.inference_mode():
        single = [layer(x[i:i + 1])[0] for i in range(64)]
        for m in (1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 48, 64):
            y = layer(x[:m])
            assert all(torch.equal(y[i], single[i]) for i in range(m)), f"M={m}"
        y = layer(x[5:22])  # a row keeps its result wherever it sits
        assert all(torch.equal(y[i], single[5 + i]) for i in range(17))
        y3 = layer(x[:12].view(3, 4, k))  # any leading shape
        assert all(torch.equal(y3.reshape(12, n)[i], single[i]) for i in range(12))
        torch.testing.assert_close(layer(x[:16]).float(), F.linear(x[:16], lin.weight, lin.bias).float(),
                                   rtol=2e-2, atol=2e-2)
        assert layer(x).shape == (70, n)  # beyond the contract: F.linear, as for a prefill


@needs_amx
def test_kernel_refuses_what_it_cannot_compute():
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    with pytest.raises(SpecwireError, match="expected bf16 inputs"):
        amx.amxdot(torch.zeros(2, 64), w)
    with pytest.raises(SpecwireError, match=r"multiples of \[16, 32\], found width 64 and weight \[30, 64\]"):
        amx.amxdot(torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(30, 64, dtype=torch.bfloat16))


@needs_amx
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_passes_are_bitwise_single_steps(tiny_target, arch):
    target = load_target(tiny_target(arch), device="cpu", dtype="bfloat16", linear="amx")
    assert linear_kind(target.model) == "amx"
    prompts = [prompt_of(n, seed=n) for n in (5, 37, 70)]
    rep = pass_invariance(target, prompts, sizes=(1, 2, 3, 5, 8, 16, 17), seed=1)
    assert rep.ok, f"{arch}: {rep.equal}/{rep.rows} rows equal; first failures {rep.failures[:5]}"


@needs_amx
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_speculation_on_an_amx_target_is_lossless(tmp_path, tree):
    target = load_target(make_tiny_target_dir(tmp_path / "t"), device="cpu", dtype="bfloat16", linear="amx")
    draft = load_engine_draft(make_draft_dir(target, tmp_path / "d"), target)
    for n_prompt in (3, 60):
        prompt = prompt_of(n_prompt, seed=n_prompt)
        ref = plain_generate(target, prompt, max_new_tokens=40, stop_on_eos=False).output_ids
        assert speculative_generate(target, draft, prompt, max_new_tokens=40, tree=tree, stop_on_eos=False,
                                    spec=SpecConfig(budget="fixed")).output_ids == ref
        oracle = OracleProposer(prompt, ref, target.spec.vocab_size)  # multi-token verify passes
        res = speculative_generate(target, oracle, prompt, max_new_tokens=40, tree=tree, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref and res.extra["accept_length"] > 2


def test_amx_in_float32_is_refused(tmp_path):
    with pytest.raises(SpecwireError, match="--linear amx is a bf16 CPU kernel; found dtype float32 on cpu"):
        load_target(make_tiny_target_dir(tmp_path), device="cpu", dtype="float32", linear="amx")


@needs_amx
def test_hf_generate_baseline_runs_transformers_own_kernels(tmp_path):
    """`invariance.stock_kernels` (what `hf-generate` runs in a bench) hands the AMX layers back to F.linear."""
    from specwire.target.invariance import stock_kernels

    target = load_target(make_tiny_target_dir(tmp_path), device="cpu", dtype="bfloat16", linear="amx")
    layers = [m for m in target.model.modules() if isinstance(m, AmxLinear)]
    assert layers and not any(m.stock for m in layers)
    x = torch.randn(3, layers[0].in_features).to(torch.bfloat16)
    with torch.inference_mode(), stock_kernels(target.model):
        assert all(m.stock for m in layers)
        assert torch.equal(layers[0](x), F.linear(x, layers[0].weight, layers[0].bias))
    assert not any(m.stock for m in layers)

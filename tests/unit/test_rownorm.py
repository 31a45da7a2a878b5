"""The compiled RMS norm (`target.rownorm`, `rownorm.c`): transformers' formula to rounding, rows independent of
each other bitwise, bf16 rounded as torch rounds, swapped in only where a module computes that formula, and the
module's own forward under the stock baseline."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from helpers import ARCHS
from specwire.target.invariance import stock_kernels
from specwire.target.load import load_target
from specwire.target.rownorm import RowRMSNorm, rms_norm_rows, rownorm_layers


def _formula(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward"""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1 / 128)])
@pytest.mark.parametrize("H", [576, 64, 13])  # 13: the tail after the 8-wide steps
def test_the_kernel_computes_the_formula_to_rounding(dtype, tol, H):
    g = torch.Generator().manual_seed(H)
    x, w = (4 * torch.randn(7, H, generator=g)).to(dtype), torch.randn(H, generator=g).to(dtype)
    got, ref = rms_norm_rows(x, w, 1e-5), _formula(x, w, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_is_bitwise_the_row_normalised_alone(dtype):
    x = torch.randn(17, 3, 576, generator=torch.Generator().manual_seed(1)).to(dtype)
    w = torch.randn(576).to(dtype)
    together = rms_norm_rows(x, w, 1e-6)
    for i in range(17):
        assert torch.equal(together[i], rms_norm_rows(x[i:i + 1], w, 1e-6)[0])
    assert torch.equal(rms_norm_rows(x[:, 1], w, 1e-6), together[:, 1])  # a strided input is read as its values


def test_bf16_output_is_rounded_to_nearest_even_as_torch_rounds():
    """With x all ones and eps 0 the normaliser is exactly 1, so y = bf16(w * 1): the kernel's rounding of float32
    weights, ties, subnormals, infinities and NaN included, against torch's."""
    w = torch.cat([torch.randn(4000) * 10.0 ** torch.randint(-30, 30, (4000,)).float(),
                   torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130, float("inf"), float("-inf"),
                                 float("nan"), 3.3895e38])])
    H = w.numel()
    x = torch.ones(1, H, dtype=torch.bfloat16)
    got = rms_norm_rows(x, w, 0.0)[0]
    want = w.to(torch.bfloat16)
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert bool(same.all()), f"{int((~same).sum())} of {H} differ, first at {w[~same][:4].tolist()}"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_rms_norm_of_a_supported_architecture_is_swapped(tiny_target, arch):
    target = load_target(tiny_target(arch), device="cpu", dtype="float32")
    kinds = {type(m).__name__ for m in target.model.modules()}
    if arch == "gpt2":  # LayerNorm: not an RMS norm
        assert "RowRMSNorm" not in kinds
        return
    assert "RowRMSNorm" in kinds and not any(k.endswith("RMSNorm") and k != "RowRMSNorm" for k in kinds)
    if arch == "qwen3":  # its per-head q and k norms too
        assert isinstance(target.model.model.layers[0].self_attn.q_norm, RowRMSNorm)


def test_a_norm_of_another_formula_keeps_its_module():
    class GemmaLikeRMSNorm(nn.Module):  # scales by 1 + weight
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.randn(64)), 1e-6

        def forward(self, x):
            return _formula(x, 1 + self.weight, self.eps)

    class LlamaLikeRMSNorm(GemmaLikeRMSNorm):
        def forward(self, x):
            return _formula(x, self.weight, self.eps)

    model = nn.Sequential(GemmaLikeRMSNorm(), LlamaLikeRMSNorm())
    assert rownorm_layers(model) == 1
    assert type(model[0]) is GemmaLikeRMSNorm and type(model[1]) is RowRMSNorm


def test_the_stock_baseline_runs_the_modules_own_forward(tiny_target):
    target = load_target(tiny_target("llama"), device="cpu", dtype="bfloat16")
    norm = target.model.model.norm
    assert isinstance(norm, RowRMSNorm)
    x = torch.randn(2, 5, norm.weight.shape[0]).to(torch.bfloat16)
    with torch.inference_mode():
        with stock_kernels(target.model):
            stock = norm(x)
        compiled = norm(x)
        assert torch.equal(stock, _formula(x, norm.weight, norm.eps))
        torch.testing.assert_close(compiled.float(), stock.float(), rtol=1 / 128, atol=1e-4)

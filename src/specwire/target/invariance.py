"""Row invariance of a target's linear layers: how many rows a product needs so a row's result is fixed.

Scope: `linear_min_rows_needed`, which measures, on this machine and for this model's own weight
shapes and dtype, the smallest row padding (`fastlinear.pad_linear_rows`) under which every row of a
product is bitwise the same whatever the number of rows beside it and wherever it sits among them;
and `stock_kernels`, the model as transformers runs it, for a baseline. Does not own the padding
itself (`fastlinear`), the attention (`attention`) or the whole-pass check (`decode.invariance`).

Why measure: a CPU BLAS chooses its kernel by shape, and its choices differ by library version and
instruction set. On our machines a one-row fp32 product takes a matrix-vector kernel and a two- or
three-row one yet another, both summing in another order than the many-row kernel; in bf16 only the
one-row kernel differs, and only for some inner sizes. Nothing here assumes that: it tries the shapes.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from specwire.target.fastlinear import PretransposedLinear, RowPadded, RowPaddedLinear

CANDIDATE_ROWS = (1, 2, 4, 8, 16)


def _products(model: nn.Module) -> list[tuple[int, object]]:
    """One (input width, row-wise product x -> y) per distinct shape, layout and dtype of the model's row-wise
    products: linear layers, pre-transposed ones, GPT-2's Conv1D, mixture-of-experts routers (fp32) and experts."""
    from transformers.pytorch_utils import Conv1D

    from specwire.target.fastlinear import RowPaddedConv1D, RowPaddedRouter, _is_router, _pads_experts

    seen, out = set(), []

    def add(kind: str, w: torch.Tensor, fn, width: int) -> None:
        key = (kind, tuple(w.shape), w.dtype)
        if key not in seen:
            seen.add(key)
            w = w.detach()
            out.append((width, w, lambda x, w=w: fn(x.to(device=w.device, dtype=w.dtype), w)))

    for m in model.modules():
        if isinstance(m, PretransposedLinear):
            add("t", m.weight_t, lambda x, w: x @ w, m.weight_t.shape[0])
        elif isinstance(m, (Conv1D, RowPaddedConv1D)):
            add("conv", m.weight, lambda x, w: torch.addmm(torch.zeros(w.shape[1], dtype=w.dtype, device=w.device), x, w),
                m.weight.shape[0])
        elif isinstance(m, RowPaddedRouter) or _is_router(m):
            add("router", m.weight, lambda x, w: F.linear(x.float(), w.float()), m.weight.shape[1])
        elif _pads_experts(m):
            add("experts-up", m.gate_up_proj[0], lambda x, w: F.linear(x, w), m.gate_up_proj.shape[2])
            add("experts-down", m.down_proj[0], lambda x, w: F.linear(x, w), m.down_proj.shape[2])
        elif isinstance(m, (nn.Linear, RowPaddedLinear)):
            add("linear", m.weight, lambda x, w: F.linear(x, w), m.weight.shape[1])
    return [(width, fn) for width, _, fn in out]


@torch.inference_mode()
def linear_min_rows_needed(model: nn.Module, *, max_rows: int = 17, trials: int = 8, seed: int = 0) -> int:
    """Smallest r in CANDIDATE_ROWS such that, for every linear weight of `model`, every row of a product
    padded to a multiple of r rows (any count up to max_rows) is bitwise the row that a one-row product
    padded to r rows gives. Inputs: random rows at several scales. Returns max_rows + 1 when none works."""
    from specwire.target.fastlinear import padded_rows

    g = torch.Generator().manual_seed(seed)
    cases = []
    for width, fn in _products(model):
        xs = [torch.randn(max_rows, width, generator=g) * (0.5 + 2 * t) for t in range(trials)]
        cases.append((fn, xs))
    for r in CANDIDATE_ROWS:
        if all(_rows_invariant(fn, x, r, padded_rows) for fn, xs in cases for x in xs):
            return r
    return max_rows + 1


def _rows_invariant(fn, x: torch.Tensor, r: int, padded_rows) -> bool:
    single = [padded_rows(x[i:i + 1], r, fn)[0] for i in range(x.shape[0])]
    for m in range(1, x.shape[0] + 1):
        y = padded_rows(x[:m], r, fn)
        if any(not torch.equal(y[i], single[i]) for i in range(m)):
            return False
    return True


@contextmanager
def stock_kernels(model: nn.Module):
    """For the duration: transformers' sdpa attention and no linear row padding (the `hf-generate` baseline,
    which should be what a user of transformers gets). Restored on exit."""
    impl = getattr(model.config, "_attn_implementation", None)
    from specwire.target.fastlinear import _pads_experts

    padded = [(m, getattr(m, "min_rows", 1)) for m in model.modules()
              if isinstance(m, (RowPadded, PretransposedLinear)) or _pads_experts(m)]
    try:
        if impl != "sdpa":
            model.set_attn_implementation("sdpa")
        for m, _ in padded:
            m.min_rows = 1
        yield model
    finally:
        for m, r in padded:
            m.min_rows = r
        if impl is not None and impl != "sdpa":
            model.set_attn_implementation(impl)

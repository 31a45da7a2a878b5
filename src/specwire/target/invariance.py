"""Row invariance of a target's linear layers: how many rows a product needs so a row's result is fixed.

Scope: `rows_needed`, which measures, on this machine and for this model's own weight shapes and
dtype, the smallest row padding (`fastlinear.pad_linear_rows`) under which every row of a product is bitwise the same whatever the number of rows beside it and wherever it sits among them;
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

from specwire.target.fastlinear import PretransposedLinear, RowPadded

CANDIDATE_ROWS = (1, 2, 4, 8, 16)


def _products(model: nn.Module) -> list[tuple[str, int, object]]:
    """(product key, input width, row-wise product x -> y) per distinct product of the model: linear layers,
    pre-transposed ones, GPT-2's Conv1D, mixture-of-experts routers (fp32) and experts (up and down)."""
    from transformers.pytorch_utils import Conv1D

    from specwire.target.fastlinear import (RowDotLinear, RowPaddedConv1D, RowPaddedRouter, _is_router, _pads_experts,
                                            product_key)
    seen, out = set(), []

    def add(key: str, w: torch.Tensor, fn, width: int, b: torch.Tensor | None = None) -> None:
        if (key, tuple(w.shape), b is None) not in seen:
            seen.add((key, tuple(w.shape), b is None))
            w, b = w.detach(), None if b is None else b.detach()
            out.append((key, width, lambda x, w=w, b=b: fn(x.to(device=w.device, dtype=w.dtype), w, b)))

    for m in model.modules():
        key = product_key(m)
        if key is None:
            continue
        if isinstance(m, PretransposedLinear):
            add(key, m.weight_t, lambda x, w, b: x @ w if b is None else x @ w + b, m.weight_t.shape[0], m.bias)
        elif isinstance(m, RowDotLinear):  # the module itself: float32 rowdot, or bf16dot in a bf16 model
            add(key, m.weight, lambda x, w, b, m=m: m(x), m.weight.shape[1], m.bias)
        elif isinstance(m, (Conv1D, RowPaddedConv1D)):
            add(key, m.weight, lambda x, w, b: torch.addmm(b, x, w), m.weight.shape[0], m.bias)
        elif isinstance(m, RowPaddedRouter) or _is_router(m):
            add(key, m.weight, lambda x, w, b: F.linear(x.float(), w.float()), m.weight.shape[1])
        elif _pads_experts(m):
            add(key, m.gate_up_proj[0], lambda x, w, b: F.linear(x, w), m.gate_up_proj.shape[2])
            add(key, m.down_proj[0], lambda x, w, b: F.linear(x, w), m.down_proj.shape[2])
        else:
            add(key, m.weight, lambda x, w, b: F.linear(x, w, b), m.weight.shape[1], m.bias)
    return out


CHECKED_VALUES = 2_000_000  # output values compared per product: enough to see rare bf16 rounding flips


@torch.inference_mode()
def rows_needed(model: nn.Module, *, max_rows: int = 17, seed: int = 0) -> dict[str, int]:
    """Per row-wise product of `model` (`fastlinear.product_key`): the smallest r in CANDIDATE_ROWS such that every
    row of a product padded to a multiple of r rows (any count up to max_rows) is bitwise the row that a one-row
    product padded to r rows gives. max_rows + 1 where none works.

    Inputs are random rows at several scales. In bf16 a kernel difference shows only where the fp32 sums differ
    across a bf16 rounding boundary (a few in 100,000 values), so each product is tried on at least
    `CHECKED_VALUES` output values (more trials for narrow products)."""
    from specwire.target.fastlinear import padded_rows

    g = torch.Generator().manual_seed(seed)
    need: dict[str, int] = {}
    for key, width, fn in _products(model):
        out = fn(torch.zeros(1, width)).shape[-1]
        trials = max(3, min(400, -(-CHECKED_VALUES // (out * max_rows))))
        xs = [torch.randn(max_rows, width, generator=g) * (0.5 + (t % 8) * 2) for t in range(trials)]
        r = next((r for r in CANDIDATE_ROWS if all(_rows_invariant(fn, x, r, padded_rows) for x in xs)), max_rows + 1)
        need[key] = max(need.get(key, 1), r)
    return need


def _rows_invariant(fn, x: torch.Tensor, r: int, padded_rows) -> bool:
    single = [padded_rows(x[i:i + 1], r, fn)[0] for i in range(x.shape[0])]
    for m in range(1, x.shape[0] + 1):
        y = padded_rows(x[:m], r, fn)
        if any(not torch.equal(y[i], single[i]) for i in range(m)):
            return False
    return True


@contextmanager
def stock_kernels(model: nn.Module):
    """For the duration: transformers' sdpa attention, no linear row padding, F.linear for every swapped
    kernel's layers (rowdot, AMX, oneDNN-packed) and each compiled norm's own module (the `hf-generate`
    baseline, which should be what a user of transformers gets). Restored on exit."""
    impl = getattr(model.config, "_attn_implementation", None)
    from specwire.target.fastlinear import AmxLinear, OneDNNLinear, RowDotLinear, _pads_experts
    from specwire.target.rownorm import RowRMSNorm

    padded = [(m, getattr(m, "min_rows", 1)) for m in model.modules()
              if isinstance(m, (RowPadded, PretransposedLinear)) or _pads_experts(m)]
    swapped = [m for m in model.modules() if isinstance(m, (RowDotLinear, AmxLinear, OneDNNLinear, RowRMSNorm))]
    try:
        if impl != "sdpa":
            model.set_attn_implementation("sdpa")
        for m, _ in padded:
            m.min_rows = 1
        for m in swapped:
            m.stock = True
        yield model
    finally:
        for m, r in padded:
            m.min_rows = r
        for m in swapped:
            m.stock = False
        if impl is not None and impl != "sdpa":
            model.set_attn_implementation(impl)

"""The compiled RMS norm of a decoding target on CPU: `RowRMSNorm` and `rownorm_layers`, which swaps it in.

Scope: the module (transformers' Llama-style RMSNorm through `rownorm.c`, built with the other row kernels by
`target.rowdot`), the check that decides whether a model's norm module computes that formula, and the swap.
Does not own the kernel's build (`rowdot`), the linear layers (`fastlinear`) nor the attention (`attention`).

Why: a decoding pass of the built-in target runs 61 RMS norms. Through transformers' module each is eight
tensor ops on one to seventeen rows of 576 numbers: tens of microseconds of dispatch for a microsecond of
arithmetic, about 1.5 ms of a 20 ms one-token step in float32 on a 2-core Zen 4, and more in a multi-token
pass. The compiled kernel computes each row with one fixed chain of operations (`rownorm.c` says which), so
its rows are invariant by construction, like the other row kernels; its results differ from the module's only
by where the sum of squares rounds. The stock baseline (`invariance.stock_kernels`) runs the module's own
forward.

Which modules: those whose class is named `...RMSNorm`, with a one-dimensional weight in the model's dtype and
an epsilon, whose output on random rows matches the kernel's to rounding (`same_formula`). Llama, Qwen2,
Qwen3 (including its per-head q and k norms), Mistral and DeepSeek-V3 norms pass; a norm of another formula
(Gemma's 1 + weight, say) fails the check and keeps its module.
"""

from __future__ import annotations

import ctypes
import logging

import torch
import torch.nn as nn

from specwire.target.rowdot import library

log = logging.getLogger("specwire")
DTYPES = (torch.float32, torch.bfloat16)  # what the kernel reads and writes
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1 / 64}  # relative: the check's margin (2 bf16 ulps)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] (float32 or bf16, CPU), weight [H] (float32 or bf16) -> [..., H] in x's dtype, by the kernel."""
    return _call(library().specwire_rmsnorm, x, weight.contiguous(), ctypes.c_float(eps))


def _call(fn, x: torch.Tensor, w: torch.Tensor, eps: ctypes.c_float) -> torch.Tensor:
    """`specwire_rmsnorm` (`fn`) over x [..., H] with the contiguous weight w [H]."""
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty_like(x)
    H = x.shape[-1]
    fn(x.data_ptr(), x.numel() // H if H else 0, H, int(x.dtype == torch.bfloat16), w.data_ptr(),
       int(w.dtype == torch.bfloat16), eps, y.data_ptr())
    return y


def _epsilon(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return None


def same_formula(module: nn.Module, eps: float) -> bool:
    """Does `module` compute weight * fl(x / rms(x)) to rounding? Checked on random rows in its weight's dtype."""
    w = module.weight
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(5, w.shape[0], generator=g)).to(w.dtype)
    with torch.inference_mode():
        ref, got = module(x), rms_norm_rows(x, w.detach(), eps)
    if ref.dtype != got.dtype or ref.shape != got.shape:
        return False
    return bool(torch.allclose(got.float(), ref.float(), rtol=TOLERANCE[w.dtype], atol=TOLERANCE[w.dtype] * 1e-3))


class RowRMSNorm(nn.Module):
    """A norm module's maths (same weight Parameter, shared not copied) through the compiled kernel. With autograd
    on, with `stock` set, or for inputs it does not take (another dtype or device), it runs the module's own
    forward."""

    stock = False

    def __init__(self, norm: nn.Module, eps: float):
        super().__init__()
        self.weight, self.eps = norm.weight, eps
        self.reference = norm.forward  # a bound method (not a submodule): the weight stays registered once
        # the call's constant arguments, resolved once: a norm runs on a handful of rows, so its dispatch is its cost
        self._fn, self._eps = library().specwire_rmsnorm, ctypes.c_float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., H] -> [..., H]
        w = self.weight
        if (self.stock or x.dtype != w.dtype or x.device.type != "cpu"
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return self.reference(x)
        return _call(self._fn, x, w, self._eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)[0]}, eps={self.eps}"


def rownorm_layers(model: nn.Module) -> int:
    """Swap every RMS norm under `model` that computes the kernel's formula (`same_formula`) for a `RowRMSNorm`,
    in place; returns how many were swapped. CPU models in float32 or bf16 only."""
    swaps, refused = [], set()
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            w, eps = getattr(child, "weight", None), _epsilon(child)
            if (not type(child).__name__.endswith("RMSNorm") or not isinstance(w, torch.Tensor) or w.dim() != 1
                    or w.dtype not in DTYPES or w.device.type != "cpu" or eps is None):
                continue
            if type(child).__name__ in refused or not same_formula(child, eps):
                refused.add(type(child).__name__)
                continue
            swaps.append((parent, name, RowRMSNorm(child, eps)))
    for parent, name, module in swaps:
        setattr(parent, name, module)
    for kind in sorted(refused):
        log.info("%s computes another formula than the compiled RMS norm: kept as it is", kind)
    return len(swaps)

"""Pre-transposed linear layers: cheaper multi-token passes of the target on CPU.

Scope: the `PretransposedLinear` module and `pretranspose_linears`, which swaps a model's `nn.Linear`
layers for it in place. Does not own model loading (`target.load`) or timing (`tools/verify_cost.py`).

Why: `nn.Linear` computes x @ W.T with W stored [out, in]. On CPU, torch's GEMM path for a few rows
against that transposed view can be much slower than x @ Wt with Wt stored [in, out] contiguously,
while a single row costs the same either way. Speculation lives on multi-token verify passes, so the
swap can help drafted decoding; whether it does depends on the CPU and the pass size
(`tools/verify_cost.py` measures it; docs/BENCHMARKS.md has our figures), so it is opt-in:
`load_target(..., linear="pretransposed")`, `--linear pretransposed`. A benchmark applies it to the one
target that every method shares, so the comparison stays fair.

Output is the same maths in another summation order: logits agree with `nn.Linear` to float rounding,
not bitwise. Losslessness is always judged against greedy decoding of the same (swapped) target.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class PretransposedLinear(nn.Module):
    """y = x @ weight_t + bias, with weight_t = W.T stored contiguously ([in, out])."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)  # [in, out]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The [out, in] view that code written for nn.Linear reads (a view, no copy)."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pretranspose_linears(model: nn.Module, *, skip: tuple[str, ...] = ()) -> int:
    """Replace every nn.Linear under `model` (except names starting with a `skip` prefix) in place.

    Tied weights are untied for the swapped module only (the embedding keeps its own tensor), which costs
    one extra copy of that matrix. Returns how many layers were swapped.
    """
    swaps = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and not name.startswith(skip) if name]
    for name, linear in swaps:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, PretransposedLinear(linear))
    return len(swaps)


def is_pretransposed(model: nn.Module) -> bool:
    return any(isinstance(m, PretransposedLinear) for m in model.modules())

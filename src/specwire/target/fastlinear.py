"""Linear layers for cheaper multi-token passes of the target on CPU: pre-transposed, oneDNN, rowdot, AMX.

Scope: the `PretransposedLinear`, `OneDNNLinear`, `RowDotLinear`, `AmxLinear` and `RowPaddedLinear` modules,
and `pretranspose_linears` / `onednn_linears` /
`rowdot_linears` / `bf16_rowdot_linears` / `split3_linears` / `q8_0_linears` / `amx_linears` / `pad_linear_rows`, which swap a model's
`nn.Linear` layers for them in place,
`concat_linears`, which packs products that read the same input into one, and `linear_kind`, which names
what a model runs. Does not own model loading
(`target.load`), the invariance check (`target.invariance`) or timing (`tools/verify_cost.py`).

Why: `nn.Linear` computes x @ W.T with W stored [out, in]. On CPU, torch's GEMM path for a few rows
against that transposed view can be much slower than x @ Wt with Wt stored [in, out] contiguously,
while a single row costs the same either way. Speculation lives on multi-token verify passes, so the
swap can help drafted decoding; whether it does depends on the CPU and the pass size
(`tools/verify_cost.py` measures it; docs/BENCHMARKS.md has our figures), so it is opt-in:
`load_target(..., linear="pretransposed")`, `--linear pretransposed`. A benchmark applies it to the one
target that every method shares, so the comparison stays fair.

Output is the same maths in another summation order: logits agree with `nn.Linear` to float rounding,
not bitwise. Losslessness is always judged against greedy decoding of the same (swapped) target.

RowDot (`--linear rowdot`, float32 on x86-64 CPUs with AVX2): nn.Linear's maths through the compiled
kernel of `target.rowdot`, in which every output is one fixed chain of operations whatever the row
count. Its products are row-invariant by construction, so they need no row padding, and a one-token
step keeps the cost of a matrix-vector product. That step is bound by reading the weights, so a layer
whose float32 weight is held exactly in fewer bytes (`target.compact`: bf16 numbers, or GGUF block codes
as in the built-in target) has the kernel read that form: same products bitwise, fewer bytes. In a bf16 model
on a CPU with AVX512-BF16 (`--dtype bfloat16 --linear rowdot`) the same module computes through
`target.bf16dot`: bf16 products by one fixed chain of VDPBF16PS, reading the GGUF codes of the float32 weight
each bf16 weight was rounded from, where they rebuild it bitwise (`bf16_rowdot_linears` checks every
element), else the bf16 weight. A served draft, float32 over bf16 weights, computes through the same kernel with
each input row split exactly into three bf16 rows (`split3_linears`): products as exact as rowdot's, summed in
another fixed order, a one-row product about a fifth cheaper (the draft needs no bitwise sums: `decode.draft_step`).
By default a served draft goes further (`q8_0_linears`): `bf16dot.q8i16dot` reads the q8_0 codes nearest its
weights, 9 bits a weight, with its float32 inputs quantized per block of 32 to int16 and each block's products summed
exactly in int32, so no weight is decoded. Exact weights did not change what the shipped draft's proposals were
accepted at, and a warm one-row draft step costs about three fifths of the exact one's (in the decoding loop the
step's framework ops weigh as much as its products: docs/BENCHMARKS.md).

oneDNN (`--linear onednn`, bf16 on a CPU whose torch has oneDNN): nn.Linear's maths through oneDNN with
the weight reordered once, at load, into the library's own blocked layout. `F.linear` hands oneDNN a plain
[out, in] weight, which it reorders on every call: in bf16 that reorder reads and writes the weights once
more, so a one-token step ran at half the memory rate of fp32. Prepacked, a bf16 pass through every linear
layer of the built-in target took about 16 ms for 1 to 16 rows on a 2-core AMX Xeon, against 23 ms for
`F.linear` (the layers alone, timed at their real shapes; whole passes: docs/BENCHMARKS.md). oneDNN picks its kernel by the row count like any BLAS, so its rows are
invariant only within a range of row counts; the row padding below is measured for it as for nn.Linear.

AMX (`--linear amx`, bf16 on a CPU with AMX-BF16): nn.Linear's maths through the compiled kernel of
`target.amx`, which reads the model's bf16 weights as they are and computes every output with one fixed
chain of AMX dot products, so its rows are invariant by construction (no padding), and the layers' cost
hardly grows with the row count: on a 2-core AMX Xeon every linear layer of the built-in target took about
11 ms at one row and 13 ms at 16, against 16.8 ms at one row through prepacked oneDNN and 23 through
F.linear (a one-token step near the machine's memory rate).

Row padding: a CPU GEMM library picks its kernel by the number of rows, and works through the rows in
blocks. A one-row product (a matrix-vector kernel), or the leftover rows after the last whole block,
can be summed in another order than a whole block. Then a one-token decoding step and a T-token verify
pass give a token different logits. `min_rows` pads every product to a multiple of that many rows
(zeros, sliced off after), so every row goes through the same kernel. The multiple is a property of
the machine, measured by `target.invariance.rows_needed` (on our CPUs: 2 in bf16, 4 in fp32);
the cost of the padding is part of the cost curve that chooses the defaults.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from specwire.errors import SpecwireError
from specwire.target.amx import BLOCK_K, BLOCK_N, library as amx_library, product as amx_product
from specwire.target.attention import MAX_INVARIANT_QUERIES
from specwire.target.bf16dot import bf16dot as _bf16dot, q8i16dot as _q8i16dot, split3dot as _split3dot
from specwire.target.compact import CompactWeight, nearest_q8_0, pack
from specwire.target.rowdot import rowdot


def padded_rows(x: torch.Tensor, multiple: int, fn) -> torch.Tensor:
    """fn(x) computed on a multiple of `multiple` rows: x [..., in] is flattened, zero-padded, the pad sliced off."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    pad = -rows % multiple
    if pad == 0 or rows == 0:
        return fn(x)
    y = fn(F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, pad)))[:rows]  # shape: [rows, out]
    return y.reshape(*x.shape[:-1], y.shape[-1])


def product_key(m: nn.Module) -> str | None:
    """Which row-wise product a module computes, by kind and weight shape ('linear:576x1536'); None if none.
    Row padding is measured and applied per key: shapes differ in which kernels their row counts select."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(m, PretransposedLinear):
        return f"t:{m.in_features}x{m.out_features}"
    if isinstance(m, RowDotLinear):
        return f"rowdot:{m.out_features}x{m.in_features}"
    if isinstance(m, AmxLinear):
        return f"amx:{m.out_features}x{m.in_features}"
    if isinstance(m, OneDNNLinear):
        return f"onednn:{m.out_features}x{m.in_features}"
    if isinstance(m, (nn.Linear, RowPaddedLinear)):
        return f"linear:{m.out_features}x{m.in_features}"
    if isinstance(m, (Conv1D, RowPaddedConv1D)):
        return f"conv:{tuple(m.weight.shape)[0]}x{tuple(m.weight.shape)[1]}"
    if isinstance(m, RowPaddedRouter) or _is_router(m):
        return f"router:{tuple(m.weight.shape)[0]}x{tuple(m.weight.shape)[1]}"
    if _pads_experts(m):
        return "experts:" + "x".join(map(str, m.gate_up_proj.shape)) + "/" + "x".join(map(str, m.down_proj.shape))
    return None


class RowPadded(nn.Module):
    """Base of the row-padded modules: they compute on a multiple of `min_rows` rows."""

    min_rows = 1


class RowPaddedLinear(RowPadded):
    """nn.Linear's maths (same weight and bias Parameters, shared not copied) on a multiple of `min_rows` rows."""

    def __init__(self, linear: nn.Linear, min_rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.min_rows = min_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        return padded_rows(x, self.min_rows, lambda t: F.linear(t, self.weight, self.bias))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, min_rows={self.min_rows}"


class RowPaddedConv1D(RowPadded):
    """GPT-2's Conv1D (y = x @ W + b, W stored [in, out]), same Parameters, on a multiple of `min_rows` rows."""

    def __init__(self, conv: nn.Module, min_rows: int):
        super().__init__()
        self.nf = conv.nf
        self.weight, self.bias = conv.weight, conv.bias
        self.min_rows = min_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., nf]
        return padded_rows(x, self.min_rows, lambda t: torch.addmm(self.bias, t.reshape(-1, t.shape[-1]), self.weight)
                           .reshape(*t.shape[:-1], self.nf))


class RowPaddedRouter(RowPadded):
    """A mixture-of-experts router (rows in, a tuple of per-row tensors out) run on a multiple of `min_rows` rows.

    Its elementwise maths (sigmoid, normalisation) runs over rows x experts values, and torch computes the
    values that do not fill whole vector registers with its scalar code, which can round differently. So
    the rows are also padded until rows x experts fills whole 64-value blocks (a no-op for real routers,
    which have 64 experts or more)."""

    def __init__(self, router: nn.Module, min_rows: int):
        super().__init__()
        self.inner = router
        self.min_rows = min_rows

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, x: torch.Tensor):  # x: [..., H] -> outputs with one row per input row
        flat = x.reshape(-1, x.shape[-1])
        multiple = max(self.min_rows, -(-64 // self.inner.weight.shape[0])) if self.min_rows > 1 else 1
        rows, pad = flat.shape[0], -flat.shape[0] % multiple
        out = self.inner(torch.cat([flat, flat.new_zeros(pad, flat.shape[1])]) if pad else flat)
        if not pad:
            return out
        return tuple(o[:rows] if torch.is_tensor(o) and o.shape[:1] == (rows + pad,) else o for o in out) \
            if isinstance(out, tuple) else out[:rows]


EXPERTS_NAME = "specwire_padded"


def padded_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' eager loop over experts, with each expert's rows padded to a multiple of `self.min_rows`
    (set by `pad_linear_rows`). Layout: gate and up concatenated, [out, in] weights, no bias."""
    r = getattr(self, "min_rows", 1)
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)  # [E+1, k, rows]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit[:, 0].tolist():
        if e == self.num_experts:
            continue
        pos, tok = torch.where(mask[e])
        h = padded_rows(hidden_states[tok], r, lambda t: F.linear(t, self.gate_up_proj[e]))
        h = self._apply_gate(h)
        h = padded_rows(h, r, lambda t: F.linear(t, self.down_proj[e]))
        final.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(final.dtype))
    return final


def _pads_experts(m: nn.Module) -> bool:
    """An experts module of transformers' ExpertsInterface in the layout `padded_experts_forward` handles."""
    return (isinstance(getattr(m, "gate_up_proj", None), torch.Tensor) and getattr(m, "gate_up_proj").dim() == 3
            and getattr(m, "has_gate", False) and not getattr(m, "has_bias", True)
            and not getattr(m, "is_transposed", True) and getattr(m, "is_concatenated", False))


def _is_router(m: nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return type(m).__name__.endswith("Router") and isinstance(w, torch.Tensor) and w.dim() == 2


class PretransposedLinear(nn.Module):
    """y = x @ weight_t + bias, with weight_t = W.T stored contiguously ([in, out])."""

    min_rows = 1

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
        return padded_rows(x, self.min_rows, self._mm)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_available() -> tuple[bool, str]:
    """(True, "") if this torch can prepack linear weights for oneDNN, else (False, why not)."""
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN (mkldnn)"
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False, f"torch {torch.__version__} has no prepacked oneDNN linear"
    return True, ""


class OneDNNLinear(nn.Module):
    """nn.Linear's maths through oneDNN, its weight reordered once into oneDNN's blocked layout (CPU only).

    The weight and bias Parameters are shared, not copied (tied weights stay tied, the fingerprint reads
    them); the packed copy is what the products read. With autograd on, or with `stock` set (the
    `invariance.stock_kernels` baseline), it runs F.linear instead."""

    min_rows = 1
    stock = False
    BATCH_HINT = 16  # the row count oneDNN packs for: a verify pass's size

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), self.BATCH_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        if self.stock or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        return padded_rows(x, self.min_rows, self._mm)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class RowDotLinear(nn.Module):
    """nn.Linear's maths (same weight and bias Parameters, shared not copied) through `target.rowdot`: float32
    rows that are bitwise independent of the rows beside them. With autograd on, or with `stock` set (the
    `invariance.stock_kernels` baseline), it runs F.linear instead, and so it does for products of more rows
    than a pass within the invariance contract holds (`attention.MAX_INVARIANT_QUERIES`: prefills and batched
    generation, which plain and speculative decoding share; the BLAS is faster there)."""

    stock = False
    bf16: torch.Tensor | CompactWeight | None = None  # what `target.bf16dot` reads in a bf16 model (`serve_bf16`)
    split3: torch.Tensor | None = None  # the bf16 weight `bf16dot.split3dot` reads in a served draft (`serve_split3`)
    q8: CompactWeight | None = None  # the nearest q8_0 codes `target.bf16dot` reads in a served draft (`serve_q8_0`)
    pad_k = 0  # zeros appended to each input row for it (a bf16 weight whose K is not a multiple of 32)

    def __init__(self, linear: nn.Linear, *, forms: tuple[str, ...] = ()):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        # the weight in the first of `forms` that holds it exactly (`target.compact`): the kernel reads it
        # instead, with bitwise the same products and fewer bytes; a copy, not refreshed if the weight changes
        self.forms = tuple(forms)
        self.compact = pack(linear.weight.detach(), self.forms) if self.forms else None

    def serve_bf16(self, codes: CompactWeight | None) -> None:
        """Compute through `target.bf16dot` (the weight is bf16 now): reading `codes`, the block codes of the
        float32 weight this one was rounded from, where they rebuild it bitwise (every element checked; no float32
        denormal, which the kernel's rounding would flush), else the bf16 weight, zero-padded to a multiple of 32 k
        (zeros add exact zeros)."""
        w = self.weight.detach()
        if w.dtype != torch.bfloat16 or w.device.type != "cpu":
            raise SpecwireError(f"RowDotLinear.serve_bf16: expected a bf16 weight on CPU, found {w.dtype} on {w.device}.")
        if codes is not None and codes.form in ("q4_1", "q8_0"):
            w32 = codes.float()
            tiny = (w32 != 0) & (w32.abs() < torch.finfo(torch.float32).tiny)
            if not tiny.any() and torch.equal(w32.to(torch.bfloat16), w):
                self.bf16, self.pad_k = codes, 0
                return
        self.bf16 = self._padded(w)

    def serve_split3(self) -> bool:
        """Compute through `target.bf16dot.split3dot` where this float32 layer's weight holds bf16 numbers (its compact
        form is bf16): float32 products as exact as rowdot's, summed in another fixed order, at the bf16 kernel's cost
        of reading the weight. For a served draft only, which needs no bitwise sums (`decode.draft_step`). Returns
        whether it does; the weight is zero-padded to a multiple of 32 k."""
        if self.compact is None or self.compact.form != "bf16" or self.compact.codes.device.type != "cpu":
            return False
        self.split3 = self._padded(self.compact.codes)
        return True

    def serve_q8_0(self) -> bool:
        """Compute through `target.bf16dot.q8i16dot` over the q8_0 codes nearest this float32 layer's weight
        (`compact.nearest_q8_0`: lossy), its float32 inputs quantized per block of 32 to int16 and each block's
        products summed exactly in int32: 9 bits read a weight instead of the bf16 form's 16, and no weight decoded
        (a one-row product about half the bf16 kernel's time over the same codes). For a served
        draft only, which needs neither exact weights nor bitwise sums (`decode.draft_step`). Returns whether it
        does (a weight on CPU); the weight is zero-padded to a multiple of 32 k."""
        w = self.weight.detach()
        if w.device.type != "cpu":
            return False
        self.q8 = nearest_q8_0(self._padded(w))
        return True

    def _padded(self, w: torch.Tensor) -> torch.Tensor:
        """A weight [N, K] as `target.bf16dot` reads it (bf16, or the float32 one q8_0 codes are taken from): zero-padded
        to a multiple of 32 k (zeros add exact zeros, and quantize to exact zeros), the inputs padded by `pad_k`."""
        from specwire.target.bf16dot import BLOCK_K as K32

        self.pad_k = -self.in_features % K32
        return F.pad(w, (0, self.pad_k)).contiguous() if self.pad_k else w

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        if (self.stock or x.numel() > MAX_INVARIANT_QUERIES * x.shape[-1]
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return F.linear(x, self.weight, self.bias)
        padded = F.pad(x, (0, self.pad_k)) if self.pad_k else x  # what the bf16 kernel reads: K a multiple of 32
        if self.bf16 is not None:
            return _bf16dot(padded, self.bf16, self.bias)
        if self.q8 is not None:  # a served draft: float32 inputs, quantized per block to int16, over q8_0 codes
            return _q8i16dot(padded, self.q8, self.bias)
        if self.split3 is not None:
            return _split3dot(padded, self.split3, self.bias)
        return rowdot(x, self.weight if self.compact is None else self.compact, self.bias)

    def extra_repr(self) -> str:
        source = self.bf16 if self.bf16 is not None else self.compact
        form = source.form if isinstance(source, CompactWeight) else "bf16" if self.bf16 is not None else \
            "float32" if self.compact is None else self.compact.form
        form += " in three-part bf16 products" if self.split3 is not None else ""
        form = "nearest q8_0 with int16 inputs" if self.q8 is not None else form
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"weights={form}"


class AmxLinear(nn.Module):
    """nn.Linear's maths (same weight and bias Parameters, shared not copied) through `target.amx`: bf16 rows
    that are bitwise independent of the rows beside them. A weight whose shape is not a multiple of the
    kernel's tiles is read from a zero-padded copy (zeros add exact zeros). With autograd on, with `stock`
    set, or for products of more rows than a pass within the invariance contract holds (prefills, which
    plain and speculative decoding share), it runs F.linear instead, as `RowDotLinear` does."""

    stock = False

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.weight.dtype != torch.bfloat16 or linear.weight.device.type != "cpu":
            raise SpecwireError(f"AmxLinear: expected a bf16 weight on CPU, found {linear.weight.dtype} on "
                                f"{linear.weight.device}.")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._fn = amx_library().specwire_amxdot_bf16
        pad_n, pad_k = -self.out_features % BLOCK_N, -self.in_features % BLOCK_K
        self.pad_k = pad_k
        # what the kernel reads: the shared weight itself, or a zero-padded copy (not refreshed if the weight changes)
        self.padded = None
        if pad_n or pad_k or not linear.weight.is_contiguous():
            self.padded = F.pad(linear.weight.detach(), (0, pad_k, 0, pad_n)).contiguous()  # shape: [N16, K32]
        self.padded_bias = None if linear.bias is None else F.pad(linear.bias.detach(), (0, pad_n)).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        if (self.stock or x.numel() > MAX_INVARIANT_QUERIES * x.shape[-1] or x.dtype != torch.bfloat16
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return F.linear(x, self.weight, self.bias)
        if self.padded is None:
            return amx_product(self._fn, x, self.weight, self.padded_bias)
        y = amx_product(self._fn, F.pad(x, (0, self.pad_k)) if self.pad_k else x, self.padded, self.padded_bias)
        return y[..., :self.out_features]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def concat_linears(linears: list[nn.Module]) -> nn.Module | None:
    """One product for several that read the same input: their weights (and biases) stacked by output rows,
    as a module of their kind (nn.Linear, AmxLinear, or RowDotLinear, packed in their compact forms where they all
    are); None for another kind, a mix of kinds or of biased and unbiased layers. The weights are copies, without
    grad."""
    kinds = {type(m) for m in linears}
    if len(kinds) != 1 or next(iter(kinds)) not in (nn.Linear, RowDotLinear, AmxLinear):
        return None
    biased = {m.bias is not None for m in linears}
    if len(biased) != 1:
        return None
    weight = torch.cat([m.weight.detach() for m in linears])  # shape: [sum of out, in]
    bias = torch.cat([m.bias.detach() for m in linears]) if biased.pop() else None
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    if isinstance(linears[0], RowDotLinear):
        packed = all(m.compact is not None for m in linears)
        out = RowDotLinear(linear, forms=linears[0].forms if packed else ())
        if all(m.q8 is not None for m in linears):  # each row's blocks are its own: the stacked codes are the same
            out.serve_q8_0()
        elif all(m.split3 is not None for m in linears):
            out.serve_split3()
        return out
    return AmxLinear(linear) if isinstance(linears[0], AmxLinear) else linear


def _swap_linears(model: nn.Module, make, skip: tuple[str, ...] = ()) -> int:
    """Replace every nn.Linear under `model` (except names starting with a `skip` prefix) by make(linear)."""
    swaps = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and not name.startswith(skip) if name]
    for name, linear in swaps:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, make(linear))
    return len(swaps)


def rowdot_linears(model: nn.Module, *, forms: tuple[str, ...] = ()) -> int:
    """Replace every nn.Linear under `model` by a `RowDotLinear` (sharing its Parameters, so tied weights stay
    tied); returns how many were swapped. `forms` (`target.compact.FORMS` or some of them): each layer whose
    float32 weight one of them holds exactly (bf16 numbers of a checkpoint stored in bf16, the block codes of a
    model converted from GGUF) reads it in that form, with bitwise the same products. The caller checks
    `target.rowdot.available()` first."""
    return _swap_linears(model, lambda linear: RowDotLinear(linear, forms=forms))


def split3_linears(model: nn.Module) -> int:
    """Make every `RowDotLinear` under `model` that reads a bf16 form compute through `bf16dot.split3dot`
    (`RowDotLinear.serve_split3`); returns how many do. For a served draft; the caller checks
    `target.bf16dot.available()` first."""
    return sum(m.serve_split3() for m in model.modules() if isinstance(m, RowDotLinear))


def q8_0_linears(model: nn.Module) -> int:
    """Make every `RowDotLinear` under `model` compute through `target.bf16dot` over the q8_0 codes nearest its
    weight (`RowDotLinear.serve_q8_0`: lossy); returns how many do. For a served draft; the caller checks
    `target.bf16dot.available()` first."""
    return sum(m.serve_q8_0() for m in model.modules() if isinstance(m, RowDotLinear))


def bf16_rowdot_linears(model: nn.Module, float32_model: nn.Module | None) -> int:
    """Make a bf16 `model` compute its linear layers through `target.bf16dot`: each nn.Linear becomes a
    `RowDotLinear` (sharing its Parameters) served in bf16, reading the GGUF block codes of `float32_model`'s layer
    of the same name where they rebuild the bf16 weight bitwise (`RowDotLinear.serve_bf16`), else the bf16 weight.
    Returns how many layers read codes. The caller checks `target.bf16dot.available()` first."""
    from specwire.target.compact import FORMS

    codes: dict[str, CompactWeight | None] = {}
    if float32_model is not None:
        for name, m in float32_model.named_modules():
            if isinstance(m, nn.Linear) and name:
                codes[name] = pack(m.weight.detach(), tuple(f for f in FORMS if f != "bf16"))
    _swap_linears(model, RowDotLinear)
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, RowDotLinear):
            m.serve_bf16(codes.get(name))
            n += isinstance(m.bf16, CompactWeight)
    return n


def amx_linears(model: nn.Module) -> int:
    """Replace every nn.Linear under `model` by an `AmxLinear` (sharing its Parameters, so tied weights stay
    tied); returns how many. The caller checks `target.amx.available()` first."""
    return _swap_linears(model, AmxLinear)


def onednn_linears(model: nn.Module) -> int:
    """Replace every nn.Linear under `model` by a `OneDNNLinear` (sharing its Parameters); returns how many.
    The caller checks `onednn_available()` first."""
    return _swap_linears(model, OneDNNLinear)


def weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes the rowdot kernel reads per pass over the model's RowDotLinear weights, bytes in the model's dtype)."""
    layers = [m for m in model.modules() if isinstance(m, RowDotLinear)]

    def read(m: RowDotLinear) -> int:
        source = m.bf16 if m.bf16 is not None else m.compact if m.compact is not None else m.weight
        return source.nbytes if isinstance(source, CompactWeight) else source.numel() * source.element_size()

    return sum(map(read, layers)), sum(m.weight.numel() * m.weight.element_size() for m in layers)


def linear_kind(model: nn.Module) -> str:
    """What the model's linear layers run: "rowdot", "amx", "onednn", "pretransposed" or "torch"
    (`target.load.LINEAR_KINDS`)."""
    kinds = {type(m) for m in model.modules()}
    for kind, cls in (("rowdot", RowDotLinear), ("amx", AmxLinear), ("onednn", OneDNNLinear), ("pretransposed", PretransposedLinear)):
        if cls in kinds:
            return kind
    return "torch"


def pretranspose_linears(model: nn.Module, *, skip: tuple[str, ...] = ()) -> int:
    """Replace every nn.Linear under `model` (except names starting with a `skip` prefix) in place.

    Tied weights are untied for the swapped module only (the embedding keeps its own tensor), which costs
    one extra copy of that matrix. Returns how many layers were swapped.
    """
    return _swap_linears(model, PretransposedLinear, skip)


def is_pretransposed(model: nn.Module) -> bool:
    return any(isinstance(m, PretransposedLinear) for m in model.modules())


def pad_linear_rows(model: nn.Module, min_rows: int | Mapping[str, int]) -> int:
    """Make the row-wise products of `model` compute on a multiple of their row count; returns how many were set.

    min_rows: one count for every product, or a count per `product_key` (a product without an entry gets the
    largest). nn.Linear layers become `RowPaddedLinear` and GPT-2's Conv1D `RowPaddedConv1D` (sharing their
    Parameters, so tied weights stay tied); mixture-of-experts routers are wrapped in `RowPaddedRouter`, and
    experts modules run `padded_experts_forward` (registered with transformers' ExpertsInterface);
    `PretransposedLinear` and `OneDNNLinear` layers get the attribute; `RowDotLinear` and `AmxLinear` layers
    need none and are left alone. A
    count of 1 swaps nothing new.
    """
    from transformers.pytorch_utils import Conv1D

    def rows_for(m: nn.Module) -> int:
        if isinstance(min_rows, int):
            return min_rows
        return int(min_rows.get(product_key(m) or "", max(min_rows.values(), default=1)))

    n, experts = 0, False
    for name, m in list(model.named_modules()):
        if isinstance(m, (RowDotLinear, AmxLinear)):  # row-invariant by construction: padding would only cost
            continue
        r = rows_for(m)
        if isinstance(m, (PretransposedLinear, OneDNNLinear, RowPadded)):
            m.min_rows = r
            n += 1
            continue
        if _pads_experts(m):
            m.min_rows = r
            experts, n = experts or r > 1, n + 1
            continue
        if not name or r <= 1 or any(name.startswith(p + ".") for p, w in _wrapped(model)):
            continue
        swap = (RowPaddedLinear(m, r) if isinstance(m, nn.Linear) else
                RowPaddedConv1D(m, r) if isinstance(m, Conv1D) else
                RowPaddedRouter(m, r) if _is_router(m) else None)
        if swap is not None:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, swap)
            n += 1
    if experts:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_NAME, padded_experts_forward)
        model.set_experts_implementation(EXPERTS_NAME)
    return n


def _wrapped(model: nn.Module):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, RowPaddedRouter)]


def linear_min_rows(model: nn.Module) -> int:
    """The row padding the model's row-wise products run with (1 = none)."""
    return max((getattr(m, "min_rows", 1) for m in model.modules()
                if isinstance(m, (PretransposedLinear, OneDNNLinear, RowPadded)) or _pads_experts(m)), default=1)

"""Exact compact forms of float32 weights: fewer bytes for the row-invariant kernel to read, same products.

Scope: `pack` finds the most compact form that holds a float32 weight [N, K] *exactly* (every element
reconstructed bitwise), and `CompactWeight` holds it for `target.rowdot.rowdot`. Does not own the kernel
(`rowdot.c`), the module that uses it (`fastlinear.RowDotLinear`) nor the choice of kernel
(`decode.kernels`).

Why: a one-token decoding step on CPU is bound by reading the weights (about 540 MB per pass for the
built-in target in float32). Many float32 models are not really float32: a checkpoint stored in bf16
holds bf16 numbers, and a model converted from a GGUF file holds dequantized block codes. The built-in
target is such a model (a Q4_1 GGUF: every layer's weight is `d * q + m` per block of 32, its embedding,
tied to the lm_head, `d * q` in Q8_0). Reading the codes and rebuilding each weight with the same float32
operations gives bitwise the float32 weight, so the kernel's fixed chain of fused multiply-adds, and
every logit, is unchanged; only the bytes read shrink (6 bits a weight for Q4_1 with float32 scales,
9 for Q8_0, 16 for bf16, against 32).

The forms, per block of 32 consecutive k of a row (`K % 32 == 0`):
- "q4_1": w = fl(fl(d * q) + m), q in 0..15 (the dequantization of GGUF's Q4_1, a rounded product then a
  rounded sum, not a fused multiply-add), codes packed two to a byte as GGUF packs them: in each block,
  byte i holds code i in its low half and code i + 16 in its high half;
- "q8_0": w = fl(q * d), q in -127..127 (GGUF's Q8_0);
- "bf16": w = the bf16 number widened (any K).
The scales d and m are whatever float32 numbers rebuild the block (a GGUF's are float16 numbers; `pack`
searches the float16 numbers next to the block's range, and checks every element). Nothing is trusted:
a form is used only where the whole weight comes back bitwise, else the next one, else none.

One lossy packer sits beside them, for a served draft only: `nearest_q8_0`, the q8_0 codes nearest a weight
(GGUF's rule: d = the block's largest magnitude / 127, q = round(w / d)). A draft needs no exact weights: the
target's verify pass decides every token, and on the built-in pair its proposals were accepted as often with
them as with its bf16 weights (`docs/BENCHMARKS.md`), at 9 bits a weight instead of 16. Nothing else uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # k per block of the block forms
FORMS = ("q4_1", "q8_0", "bf16")  # most compact first: `pack` takes the first that holds the weight exactly
_NEIGHBOURS = 3  # float16 steps searched each side of a block's estimated scale


@dataclass(frozen=True)
class CompactWeight:
    """A float32 weight [N, K] held exactly in a compact `form`: `codes` (q4_1: uint8 [N, K // 2]; q8_0: int8
    [N, K]; bf16: bfloat16 [N, K]), and for the block forms the scales `d` (and q4_1's `m`), float32
    [N, K // 32]."""

    form: str
    shape: tuple[int, int]
    codes: torch.Tensor
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.d, self.m) if t is not None)

    def float(self) -> torch.Tensor:
        """The float32 weight [N, K] rebuilt with the kernel's operations."""
        N, K = self.shape
        if self.form == "bf16":
            return self.codes.float()
        if self.form == "q8_0":
            q = self.codes.view(N, K // BLOCK, BLOCK).float()
            return (q * self.d[..., None]).view(N, K)
        q = _unpack4(self.codes, K).view(N, K // BLOCK, BLOCK).float()
        return (q * self.d[..., None] + self.m[..., None]).view(N, K)  # two roundings: mul, then add


def pack(weight: torch.Tensor, forms: tuple[str, ...] = FORMS) -> CompactWeight | None:
    """The first of `forms` that holds this float32 weight [N, K] bitwise, or None."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or not torch.isfinite(weight).all():
        return None
    w = weight.detach().contiguous()
    for form in forms:
        packed = _pack_bf16(w) if form == "bf16" else _pack_blocks(w, form) if w.shape[1] % BLOCK == 0 else None
        if packed is not None and torch.equal(packed.float(), w):
            return packed
    return None


def nearest_q8_0(weight: torch.Tensor) -> CompactWeight:
    """The q8_0 codes nearest `weight` [N, K] (float32 or bf16 numbers, K % 32 == 0): per block of 32 k, d = its
    largest magnitude / 127 and q = round(w / d) in -127..127; a block of zeros gets d = 0. Lossy: each rebuilt
    weight is within d / 2 of the weight before the kernel rounds it to bf16. For a served draft only."""
    w = weight.detach().float().contiguous()
    if w.dim() != 2 or w.shape[1] % BLOCK or not torch.isfinite(w).all():
        raise ValueError(f"nearest_q8_0: expected a finite [N, K] weight with K a multiple of {BLOCK}, found "
                         f"shape {tuple(w.shape)}")
    N, K = w.shape
    blocks = w.view(N, K // BLOCK, BLOCK)  # shape: [N, KB, 32]
    d = blocks.abs().amax(-1) / 127  # shape: [N, KB]
    q = torch.round(blocks / torch.where(d == 0, torch.ones(()), d)[..., None]).clamp(-127, 127)
    return CompactWeight("q8_0", (N, K), q.to(torch.int8).view(N, K).contiguous(), d.contiguous())


def _pack_bf16(w: torch.Tensor) -> CompactWeight:
    return CompactWeight("bf16", tuple(w.shape), w.to(torch.bfloat16))


def _pack_blocks(w: torch.Tensor, form: str) -> CompactWeight | None:
    """q4_1 or q8_0 codes and scales for every block of w, or None where some block has no exact scale."""
    N, K = w.shape
    blocks = w.view(N, K // BLOCK, BLOCK)  # shape: [N, KB, 32]
    if form == "q4_1":
        m = blocks.amin(-1)  # the block's code 0 rebuilds exactly m (fl(d * 0) + m)
        top, levels, offset = blocks.amax(-1) - m, 15, m
    else:
        m, top, levels, offset = None, blocks.abs().amax(-1), 127, torch.zeros(())
    estimate = (top / levels).to(torch.float16)
    found = torch.zeros(N, K // BLOCK, dtype=torch.bool)
    d = torch.zeros(N, K // BLOCK)
    q = torch.zeros(N, K // BLOCK, BLOCK)
    for step in _steps():  # float16 neighbours of the estimate, nearest first
        cand = _fp16_step(estimate, step).float()  # shape: [N, KB]
        safe = torch.where(cand == 0, torch.ones(()), cand)
        qc = torch.round((blocks - offset[..., None]) / safe[..., None])
        qc = qc.clamp(0, levels) if form == "q4_1" else qc.clamp(-levels, levels)
        qc = torch.where((cand == 0)[..., None], torch.zeros(()), qc)
        rebuilt = qc * cand[..., None] + m[..., None] if form == "q4_1" else qc * cand[..., None]
        exact = (rebuilt == blocks).all(-1) & ~found
        d = torch.where(exact, cand, d)
        q = torch.where(exact[..., None], qc, q)
        found |= exact
        if found.all():
            break
    if not found.all():
        return None
    if form == "q8_0":
        return CompactWeight(form, (N, K), q.to(torch.int8).view(N, K).contiguous(), d.contiguous())
    return CompactWeight(form, (N, K), _pack4(q.to(torch.uint8).view(N, K)), d.contiguous(), m.contiguous())


def _steps():
    yield 0
    for s in range(1, _NEIGHBOURS + 1):
        yield -s
        yield s


def _fp16_step(x: torch.Tensor, step: int) -> torch.Tensor:
    """The float16 number `step` representable steps from each (non-negative, finite) element of x."""
    if step == 0:
        return x
    bits = x.view(torch.int16).to(torch.int32) + step
    return bits.clamp(0, 0x7BFF).to(torch.int16).view(torch.float16)  # 0x7BFF: the largest finite float16


def _pack4(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [N, K] -> [N, K // 2] bytes, GGUF's layout: in each block of 32, byte i holds code i in
    its low half and code i + 16 in its high half."""
    N, K = q.shape
    b = q.view(N, K // BLOCK, 2, BLOCK // 2)  # shape: [N, KB, 2, 16]
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(N, K // 2).contiguous()


def _unpack4(codes: torch.Tensor, K: int) -> torch.Tensor:
    """The inverse of `_pack4`: [N, K // 2] bytes -> uint8 codes [N, K]."""
    N = codes.shape[0]
    b = codes.view(N, K // BLOCK, BLOCK // 2)  # shape: [N, KB, 16]
    return torch.stack([b & 0xF, b >> 4], dim=2).reshape(N, K)

"""The served draft's layer pass: the maths of `Eagle3Draft.step` in the fewest tensor ops, for decoding.

Scope: `ServedStep`, built once per served draft by `decode.engine.load_engine_draft` (`ServedStep.build`,
kept as `draft.served`), which runs one draft layer pass over T rows against a proposer's `DraftKVCache`,
`draft_kernel`, which kernel the served draft's products run beside a given target, and `draft_products`, what a
loaded draft's products run, as a bench reports it.
Does not own the maths (`draft.model`: `Eagle3Draft.step` is the definition, and training and `specwire
eval` run it; `tests/unit/test_draft_step.py` checks this pass against it, bitwise), the cache
(`decode.proposer.DraftKVCache`), the rope table (`decode.proposer.EagleProposer._rope`) nor the kernels
themselves (`target.fastlinear`).

Why: the draft runs once per drafted depth, so its step is paid k times per round, and the speed issue
asks for at most 0.04 of a target step. On a CPU one draft step over one row is a handful of products and
some sixty small tensor ops, each costing microseconds of dispatch: through the modules, about a third of
the step was ops and module calls, not products. Here q|k|v and gate|up are one product each
(`target.fastlinear.concat_linears`: under rowdot every output row is its own fixed chain, so a packed
product is bitwise the separate ones), the norms are their modules' forward (one compiled call each where the
draft runs rowdot: `target.rownorm`), rope comes from a table, the new keys and values are written into the
cache in place, and no module's `__call__` runs. Every other op is
the module path's own op on the same inputs. The packed weights are copies made at load time: a served
draft is not trained further.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specwire.draft.model import Eagle3Draft, apply_rope
from specwire.target.fastlinear import concat_linears, linear_kind

if TYPE_CHECKING:
    from specwire.target.load import Target


class ServedStep:
    """`Eagle3Draft.step` + `logits` for decoding, over a proposer's cache."""

    @classmethod
    def build(cls, draft: Eagle3Draft) -> "ServedStep | None":
        """The served pass of `draft` (products already in their serving kernel), or None where its products
        cannot be packed (another module kind); the engine then runs the modules."""
        layer = draft.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        qkv = concat_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up = concat_linears([mlp.gate_proj, mlp.up_proj])
        return None if qkv is None or gate_up is None else cls(draft, qkv, gate_up)

    def __init__(self, draft: Eagle3Draft, qkv: torch.nn.Module, gate_up: torch.nn.Module):
        layer = draft.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        self.draft = draft
        self.nh, self.nkv, self.d = attn.nh, attn.nkv, attn.d
        self.norm_before_residual = layer.norm_before_residual
        # forward, not __call__: no hooks are set on a served draft, and each __call__ costs microseconds
        self.qkv, self.o = qkv.forward, attn.o_proj.forward
        self.gate_up, self.down, self.head = gate_up.forward, mlp.down_proj.forward, draft.lm_head.forward
        # the norms' own modules (compiled where the draft runs rowdot: `target.rownorm`, swapped in by the engine)
        self.norm_in, self.norm_hidden = layer.input_layernorm.forward, layer.hidden_norm.forward
        self.norm_post, self.norm_final = layer.post_attention_layernorm.forward, draft.norm.forward

    def __call__(self, hidden, ids, rope, cache, mask, *, last_only: bool):
        """hidden [1, T, H], ids [1, T] (target ids), rope (cos, sin) each [1, T, d], mask [1, 1, T, L+T] bool
        or None (every query sees every cached entry) -> logits [T', Vd], hidden [T', H], T' = 1 if last_only
        else T. Appends the T new keys and values to `cache`."""
        nh, nkv, d = self.nh, self.nkv, self.d
        T = hidden.shape[1]
        hn = self.norm_hidden(hidden)
        x = torch.cat([self.norm_in(self.draft.embed(ids)), hn], dim=-1)  # shape: [1, T, 2H]
        qkv = self.qkv(x).view(1, T, nh + 2 * nkv, d).transpose(1, 2)  # shape: [1, nh+2nkv, T, d]
        qk = apply_rope(qkv[:, : nh + nkv], *rope)  # shape: [1, nh+nkv, T, d]
        start, end = cache.length, cache.length + T
        cache.reserve(end)
        cache.k[:, :, start:end] = qk[:, nh:]
        cache.v[:, :, start:end] = qkv[:, nh + nkv:]
        cache.length = end
        a = F.scaled_dot_product_attention(qk[:, :nh], cache.k[:, :, :end], cache.v[:, :, :end], attn_mask=mask,
                                           enable_gqa=nkv != nh)  # shape: [1, nh, T, d]
        h = (hn if self.norm_before_residual else hidden) + self.o(a.transpose(1, 2).reshape(1, T, nh * d))
        gate, up = self.gate_up(self.norm_post(h)).chunk(2, dim=-1)  # each [1, T, I]
        h = h + self.down(F.silu(gate) * up)  # shape: [1, T, H]
        if last_only:
            h = h[:, -1:]
        return self.head(self.norm_final(h))[0], h[0]


def draft_kernel(target: Target) -> str:
    """The kernel of a served draft's products: "rowdot" (float32 arithmetic over the draft's weights, read as bf16
    where they are bf16 numbers; on a CPU with AVX512-BF16, the bf16 kernel over their nearest q8_0 codes by default,
    `decode.engine.load_engine_draft`), "amx", or "torch" (the draft's modules in the target's dtype, as loaded).

    A draft needs no invariance (the target's verify pass decides every token), so only speed chooses. It takes
    the target's kernel where that is rowdot or AMX (both read the draft's bf16 weights at the memory rate in a
    one-row step). A bf16 target on another CPU kernel (oneDNN, nn.Linear, pre-transposed) gets a rowdot draft
    where the compiled kernel runs: a one-row bf16 product through torch costs more than rowdot's over the
    same bf16 bytes, and the draft steps k times a round. (`tools/draft_step_cost.py` times both: on a 2-core
    Zen 4 with AVX512-BF16 a served one-row step took 1.45 ms on rowdot against 1.94 through oneDNN's bf16, and
    the bf16 MT-bench chain went from 1.78x to 1.85x plain.) The draft's inputs, the target's states and token
    embeddings, are cast to float32, exactly; its proposals are token ids, so nothing of its dtype reaches the
    target. A float32 target on nn.Linear keeps a module draft: the reference path."""
    from specwire.target.rowdot import available

    return served_draft_kernel(str(target.dtype).replace("torch.", ""), linear_kind(target.model),
                               rowdot_runs=target.device.type == "cpu" and available()[0])


def draft_products(draft: Eagle3Draft) -> str:
    """What a loaded draft's products run, as a bench states it: "q8_0 weights, int16 inputs" (the nearest q8_0
    codes, inputs quantized per block to int16: `fastlinear.q8_0_linears`), "three-part bf16" (float32 inputs split
    exactly into bf16 parts, `target.bf16dot.split3dot`), "rowdot, bf16 weights", or the kind of its linear layers
    and its dtype."""
    from specwire.target.fastlinear import RowDotLinear

    if not isinstance(draft, Eagle3Draft):  # another proposer (tests, experiments)
        return type(draft).__name__
    layers = [m for m in draft.modules() if isinstance(m, RowDotLinear)]
    if layers and all(m.q8 is not None for m in layers):
        return "q8_0 weights, int16 inputs"
    if layers and all(m.split3 is not None for m in layers):
        return "three-part bf16"
    if layers and all(m.compact is not None and m.compact.form == "bf16" for m in layers):
        return "rowdot, bf16 weights"
    return f"{linear_kind(draft)}, {str(draft.fc.weight.dtype).removeprefix('torch.')}"


def served_draft_kernel(dtype: str, linear: str, *, rowdot_runs: bool) -> str:
    """`draft_kernel`'s rule for a target of `dtype` on `linear`, where `rowdot_runs` says whether the compiled
    rowdot kernel runs on the target's device (also what `decode.kernels` prices a draft step by when it ranks
    kernels it has not loaded)."""
    if linear in ("rowdot", "amx"):
        return linear
    if dtype == "bfloat16" and rowdot_runs:
        return "rowdot"
    return "torch"

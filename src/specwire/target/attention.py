"""Batch-invariant attention: a pass over T new tokens gives, row by row, bitwise what T single steps give.

Scope: the invariant attention functions and their mask function, registered with transformers'
`AttentionInterface` / `AttentionMaskInterface` under `ATTENTION_NAME` (compiled where it runs) and
`TORCH_ATTENTION_NAME`; `compiled_attention`, the caller of the compiled kernel; `use_invariant_attention`
switches a loaded model to one of them. Does not own the linear layers (`fastlinear`: they have their own
row-invariance rule) nor the check that a whole model is invariant (`invariance`).

Why: speculative decoding is lossless only if the target's logits for a drafted token are exactly those
that plain decoding would compute for it. The maths is the same; the arithmetic is not. A verify pass
scores T query rows against the cache at once, and a tree pass hides each node's non-ancestors with a
mask, so a row's reduction over the keys runs in another grouping than a one-row step would use, and
its result moves by an ulp. In bf16 that is enough to flip a near-tie between two tokens.

The rule this function keeps: a row's result depends only on its own query and the sequence of keys it
may see, taken in order (its *ranks*: the cached prefix, then its ancestors, root first), never on how
many rows share the pass, where its keys sit in the pass, or how many masked keys lie between them.
Two implementations keep it, in fp32 whatever the model's dtype; they are not bitwise equal to each
other, and a process uses one for plain and speculative decoding alike:
  - compiled (`compiled_attention`, `rowattn.c`, the default on x86-64 CPUs where `target.rowdot` builds):
    each (row, head) is computed whole by one thread as one fixed chain over its visible keys in rank
    order; hidden keys are skipped. Its header gives the chain. A one-token step costs about a fifth of the
    torch form below on a 2-core AVX2 machine.
  - torch (`torch_invariant_attention`, elsewhere: CUDA, other CPUs, or asked for by name):
    - scores: one GEMM Q @ K^T with at least `MIN_GEMM_ROWS` rows and the keys padded to whole
      `CHUNK`-key blocks. Each score is then the same chain of fused multiply-adds over the head
      dimension, whatever its row or column.
    - softmax numerator: the row maximum over its visible keys (exact in any order), exp(s - max).
    - the reduction over keys, numerator and denominator together: the values get a column of ones
      appended, and the keys are cut into chunks of `CHUNK` *ranks*. Each chunk is one GEMM whose inner
      dimension is short enough to run as one sequential chain (masked keys inside it are exact zeros,
      and adding zero changes nothing), and the chunk results are accumulated in rank order by a
      sequential scan. A row whose last chunks are empty adds exact zeros.
    - chunks that lie wholly in the cached prefix are shared by every row (one batched GEMM); the chunks
      that hold this pass's keys are taken per rank by masking, so a tree node's ancestors fall in the
      same chunk as in the single-step decoding of the accepted path.
Passes outside this contract (a batch of several sequences, a padded or windowed prefix, more than
`MAX_INVARIANT_QUERIES` new tokens, soft-capping or sinks) run through sdpa: prefills and batched
generation are shared by plain and speculative decoding alike, so they need no invariance. The one
exception is speed: a batch of sequences with one new token each (the decode step of batched
generation) runs `rows_attention`, plain grouped GEMMs, much faster than sdpa's CPU kernel there.

The torch form's GEMM facts (rows of at least `MIN_GEMM_ROWS`, inner chains up to 192 long) were measured
on the CPU BLAS that torch ships; `specwire.target.invariance` checks them on the model and machine at hand,
and the engine reports a pass that fails the check instead of claiming losslessness.
"""

from __future__ import annotations

import math

import torch

ATTENTION_NAME = "specwire_invariant"  # compiled kernel on CPU where it runs, else the torch form
TORCH_ATTENTION_NAME = "specwire_invariant_torch"  # always the torch form
INVARIANT_NAMES = (ATTENTION_NAME, TORCH_ATTENTION_NAME)
CHUNK = 64  # keys per reduction chunk (ranks), and the padding unit of the score GEMM's columns
MIN_GEMM_ROWS = 16  # every score/value GEMM gets at least this many rows (small-M kernels sum differently)
MAX_INVARIANT_QUERIES = 64  # larger passes (prefills) take the sdpa path; keeps each tail chain <= 127 long


def _sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if key.dtype != query.dtype:  # a cache that stores wider keys and values (`data.continuous`)
        key, value = key.to(query.dtype), value.to(query.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


class _PassPlan:
    """Per-pass index work shared by every layer: visibility and per-rank chunk masks. Built once per mask."""

    def __init__(self, mask: torch.Tensor | None, q_len: int, k_len: int, rows: int, device):
        self.mask = mask  # kept so the cache below can compare identity safely
        self.q_len, self.k_len, self.rows = q_len, k_len, rows
        past = k_len - q_len
        self.prefix_hidden = mask is not None and past > 0 and not bool(mask[0, 0, :, :past].all())
        self.base = (past // CHUNK) * CHUNK  # first key of the chunk that holds the cache's end
        self.cols = -(-k_len // CHUNK) * CHUNK  # keys padded to whole chunks
        if mask is None:
            tail = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
        else:
            tail = mask[0, 0, :, past:]  # shape: [Tq, Tq], which of this pass's keys each row sees
        tail = torch.cat([tail, tail.new_ones(rows - q_len, q_len)], dim=0)  # padding rows see everything
        pad = tail.new_zeros(rows, self.cols - k_len)  # the padding keys: seen by no row
        region = torch.cat([tail.new_ones(rows, past - self.base), tail, pad], dim=1)  # shape: [R, cols - base]
        self.visible = torch.cat([region.new_ones(rows, self.base), region], dim=1)  # shape: [R, cols]
        rank = region.long().cumsum(-1) - 1  # rank of each visible key within the region
        chunk = torch.where(region, rank // CHUNK, -1)
        n_tail = int(chunk.max()) + 1
        self.tail_keep = torch.stack([(chunk == j).float() for j in range(n_tail)])  # shape: [nt, R, cols - base]
        self._by_group: dict[int, tuple] = {}

    def for_group(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The hidden-key mask [g*R, cols] and the tail chunk masks [nt, g*R, cols - base], per head in a group."""
        if g not in self._by_group:
            self._by_group[g] = (~self.visible.repeat(g, 1), self.tail_keep.repeat(1, g, 1))
        return self._by_group[g]


_plan_cache: list[_PassPlan] = []


def _plan(mask, q_len, k_len, rows, device) -> _PassPlan:
    if _plan_cache:
        p = _plan_cache[0]
        if p.mask is mask and (p.q_len, p.k_len, p.rows) == (q_len, k_len, rows) and (
                mask is not None or p.visible.device == torch.device(device)):
            return p
    p = _PassPlan(mask, q_len, k_len, rows, device)
    _plan_cache[:] = [p]
    return p


def invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, H, Tq, dk], key [1, Hkv, Tk, dk], value [1, Hkv, Tk, dv] -> ([1, Tq, H, dv], None).

    attention_mask: bool [1, 1, Tq, Tk] (True = may attend) or None (causal). On CPU where the compiled
    kernels run (`target.rowdot.available`), the pass goes to `compiled_attention`; elsewhere to the torch form
    below (`torch_invariant_attention`). Both keep the rule; they are not bitwise equal to each other.
    """
    return _invariant(module, query, key, value, attention_mask, scaling, dropout, True, **kwargs)


def torch_invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """`invariant_attention` always in its torch form (registered as `TORCH_ATTENTION_NAME`)."""
    return _invariant(module, query, key, value, attention_mask, scaling, dropout, False, **kwargs)


def _invariant(module, query, key, value, attention_mask, scaling, dropout, compiled, **kwargs):
    B, H, Tq, dk = query.shape
    Hkv, Tk, dv = key.shape[1], key.shape[2], value.shape[-1]
    special = any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "sinks"))
    plain_mask = attention_mask is None or attention_mask.dtype == torch.bool
    if B > 1 and Tq == 1 and plain_mask and not special and not (dropout and module.training):
        return rows_attention(query, key, value, attention_mask, scaling)
    if (B != 1 or Tq > MAX_INVARIANT_QUERIES or special or (dropout and module.training)
            or (attention_mask is not None and attention_mask.dtype != torch.bool)):
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if compiled and query.device.type == "cpu" and kernels_available():
        prefix_hidden, tail = _compiled_plan(attention_mask, Tq, Tk)
        if prefix_hidden:  # a padded or windowed prefix: outside the contract
            return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        return compiled_attention(query, key, value, tail, scaling), None
    g = H // Hkv
    rows = max(Tq, -(-MIN_GEMM_ROWS // g))  # query rows, padded so each GEMM has >= MIN_GEMM_ROWS rows
    plan = _plan(attention_mask, Tq, Tk, rows, query.device)
    if plan.prefix_hidden:  # a padded or windowed prefix: outside the contract
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    M, cols, base = g * rows, plan.cols, plan.base
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dk)
    f32 = dict(dtype=torch.float32, device=query.device)

    q = torch.empty(Hkv, g, rows, dk, **f32)  # (torch.empty + explicit zero padding: torch.zeros is slow here)
    q[:, :, :Tq] = query[0].view(Hkv, g, Tq, dk)
    q[:, :, Tq:] = 0.0
    q = q.mul_(scale).view(Hkv, M, dk)  # row index = head-in-group * rows + query
    k = torch.empty(Hkv, cols, dk, **f32)
    k[:, :Tk] = key[0]
    k[:, Tk:] = 0.0
    v = torch.empty(Hkv, cols, dv + 1, **f32)  # values, then a column of ones (the softmax denominator)
    v[:, :Tk, :dv] = value[0]
    v[:, :Tk, dv] = 1.0
    v[:, Tk:] = 0.0
    hidden, tail_keep = plan.for_group(g)
    scores = torch.matmul(q, k.transpose(1, 2)).masked_fill_(hidden, float("-inf"))  # shape: [Hkv, M, cols]
    e = scores.sub_(scores.amax(-1, keepdim=True)).exp_()

    nb = base // CHUNK
    tail = torch.matmul(e[:, None, :, base:] * tail_keep, v[:, None, base:])  # shape: [Hkv, nt, M, dv+1]
    if nb:  # chunks wholly inside the cached prefix: the same keys at the same ranks for every row
        e_pre = e[:, :, :base].reshape(Hkv, M, nb, CHUNK).transpose(1, 2)  # shape: [Hkv, nb, M, C]
        tail = torch.cat([torch.matmul(e_pre, v[:, :base].reshape(Hkv, nb, CHUNK, dv + 1)), tail], dim=1)
    acc = tail.cumsum(dim=1)[:, -1]  # shape: [Hkv, M, dv+1], the chunks summed in rank order
    out = (acc[..., :dv] / acc[..., dv:]).view(H, rows, dv)[:, :Tq]  # shape: [H, Tq, dv]
    return out.transpose(0, 1).to(query.dtype)[None], None


_compiled_cache: list[tuple] = []


def _compiled_plan(mask, q_len: int, k_len: int) -> tuple[bool, torch.Tensor | None]:
    """(is part of the cached prefix hidden?, this pass's own keys each row sees as uint8 [Tq, Tq] or None for
    causal), computed once per pass (every layer shares the mask)."""
    if _compiled_cache and _compiled_cache[0][0] is mask and _compiled_cache[0][1] == (q_len, k_len):
        return _compiled_cache[0][2]
    past = k_len - q_len
    if mask is None:
        plan = (False, None)
    else:
        plan = (past > 0 and not bool(mask[0, 0, :, :past].all()),
                mask[0, 0, :, past:].to(torch.uint8).contiguous())  # shape: [Tq, Tq]
    _compiled_cache[:] = [(mask, (q_len, k_len), plan)]
    return plan


def compiled_attention(query, key, value, tail: torch.Tensor | None, scaling=None, *,
                       build: str | None = None) -> torch.Tensor:
    """query [1, H, Tq, dk], key [1, Hkv, Tk, dk], value [1, Hkv, Tk, dv] -> [1, Tq, H, dv] in query's dtype.

    `rowattn.c`, in fp32 (a bf16 cache widened exactly as it is read): row i sees the cached prefix (keys
    0..Tk-Tq-1) and this pass's keys j where tail[i, j] (uint8 [Tq, Tq]; None: j <= i). Each (row, head) is one
    fixed chain over its visible keys in order, computed whole by one thread, so it is bitwise what a one-token
    step would compute. `build` names the kernels' build (`rowdot.ISA_FLAGS`; default: this process's): every
    build gives bitwise the same results."""
    from specwire.target.rowdot import library

    _, H, Tq, dk = query.shape
    Hkv, Tk, dv = key.shape[1], key.shape[2], value.shape[-1]
    # a bf16 cache is read as it is (the kernel widens each number exactly as it loads it): no float32 copy of
    # the whole cache every pass
    bf16 = key.dtype == value.dtype == torch.bfloat16
    q = query[0].float()  # shape: [H, Tq, dk]
    k, v = (t[0] if bf16 else t[0].float() for t in (key, value))  # shapes: [Hkv, Tk, dk], [Hkv, Tk, dv]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dk)
    out = torch.empty(Tq, H, dv, dtype=torch.float32)
    work = torch.empty(Tq * H, Tk, dtype=torch.float32)  # each (row, head)'s scores
    lib = library(build)
    kernel = lib.specwire_rowattn_bf16kv if bf16 else lib.specwire_rowattn_f32
    kernel(q.data_ptr(), Tq, H, dk, q.stride(1), q.stride(0), k.data_ptr(), Hkv, k.stride(0), k.stride(1),
           v.data_ptr(), dv, v.stride(0), v.stride(1), Tk - Tq, None if tail is None else tail.data_ptr(), scale,
           work.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return out[None].to(query.dtype)


def rows_attention(query, key, value, attention_mask, scaling=None):
    """One new token for each of B sequences: query [B, H, 1, dk], key [B, Hkv, Tk, dk] -> ([B, 1, H, dv], None).

    The decode step of batched generation (HF `generate`, `data.continuous`). Plain grouped GEMMs with the
    softmax in fp32: for one query row per sequence, sdpa's flash kernel on CPU is several times slower
    (and its callers first copy the key/value heads once per query head). The keys and values may be
    strided views and may already be fp32 (the continuous-batching cache stores them so).
    attention_mask: bool [B, 1, 1, Tk] (True = may attend) or None (all keys).
    """
    B, H, _, dk = query.shape
    Hkv, Tk, dv = key.shape[1], key.shape[2], value.shape[-1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dk)
    q = query.view(B, Hkv, H // Hkv, dk).float()  # shape: [B, Hkv, g, dk]
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)  # shape: [B, Hkv, g, Tk]
    if attention_mask is not None:
        scores.masked_fill_(~attention_mask[:, :, -1:, :Tk], float("-inf"))  # [B or 1, 1, 1, Tk] broadcasts
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value.float())  # shape: [B, Hkv, g, dv]
    return out.view(B, 1, H, dv).to(query.dtype), None


def invariant_mask(*args, **kwargs):
    """transformers' sdpa mask, but always materialised (the attention reads the tree/causal structure)."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


_registered = False


def register(kernel: str = "auto") -> str:
    """Register the functions with transformers (idempotent); returns the attention-implementation name for
    kernel "auto" (compiled where it runs) or "torch"."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(ATTENTION_NAME, invariant_attention)
        AttentionInterface.register(TORCH_ATTENTION_NAME, torch_invariant_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, invariant_mask)
        ALL_MASK_ATTENTION_FUNCTIONS.register(TORCH_ATTENTION_NAME, invariant_mask)
        _registered = True
    return TORCH_ATTENTION_NAME if kernel == "torch" else ATTENTION_NAME


def use_invariant_attention(model, kernel: str = "auto") -> None:
    """Switch a loaded HF model to the invariant attention: kernel "auto" (the compiled one on CPU where it runs,
    else the torch form) or "torch"."""
    model.set_attn_implementation(register(kernel))


def kernels_available() -> bool:
    """Do the compiled kernels build and run on this machine (`target.rowdot.available`, cached per process)?"""
    from specwire.target.rowdot import available

    return available()[0]

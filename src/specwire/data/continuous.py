"""Continuous batching for datagen: many answers decoded in one batch, a finished row refilled at once.

Scope: `generate_continuous` (prompts -> per prompt the answer ids and how it finished, greedy or
sampled), `supports_continuous` (whether a target's attention can run it), and the slot KV cache it
runs on. Does not own the dump (`datagen`), the self-instruct build (`selfinstruct`), nor the
speculative engine (`specwire.decode`).

Why not HF `generate` on a padded batch, as datagen did before: on the built-in target at 64 rows,
  - the dynamic cache concatenates every layer's keys and values at every step, copying the whole
    cache: a quarter of the step's time;
  - a batch runs until its longest row ends, so every row that stopped early keeps computing, and a
    short request sampled beside a long one costs as much as the long one;
  - the batch is left-padded to its longest prompt.
Measured side by side in `docs/PROMPT_POOL.md` (datagen throughput).

How (pure index bookkeeping around the model's own forward; no model file is touched):
  - **Slots.** `slots` rows share one static buffer per layer for keys and values, shape
    [slots, kv_heads, columns, head_dim], written in place.
  - **A shared clock t.** At each step every live row writes its new token's key and value at column
    t. Row s holds its tokens in columns [start_s, t), and its position ids are its own (t - start_s),
    so rotary or absolute positions are exactly those of unbatched decoding. A 4D mask
    [slots, 1, 1, t + 1] lets row s see columns start_s..t and nothing else.
  - **Refill.** A row that ends (end-of-turn token or its length cap) takes the next prompt. The new
    prompts of one step are prefilled together (right-padded, so each prompt keeps positions 0..P-1),
    and their keys and values are copied into columns [t - P, t) of their slots. If t < P, all
    columns are first shifted right.
  - **Compaction.** When t reaches the buffer's width, every row's columns move left together so the
    longest live row starts at column 0; this happens at most once every `COMPACT_MARGIN` steps.
  - **Tail.** Once no prompt is left, finished rows are dropped from the batch (buffers index-selected)
    whenever at most 3/4 of the rows are still live.

Arithmetic: a row of a batched GEMM, or a reduction over keys some of which are masked, is not bitwise
what an unbatched step computes, so a greedy answer can leave unbatched decoding at a near-tie, exactly
as with HF `generate` on a padded batch. The agreement rate is measured and published, not assumed.

Limits: the target's attention must read keys and values through the cache's `update` and honour a 4D
mask (every full-attention architecture in transformers does). A sliding window shorter than the
longest sequence is not expressed by the mask, so such targets keep HF `generate`
(`supports_continuous` says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from specwire.decode.sampling import SamplingParams, make_generator, next_token
from specwire.errors import SpecwireError
from specwire.target.attention import INVARIANT_NAMES
from specwire.target.heap import release_freed_memory
from specwire.target.load import Target

COMPACT_MARGIN = 64  # buffer columns beyond the longest sequence: steps between two compactions, at least
PREFILL_TOKENS = 4096  # cap on padded tokens in one prefill batch
RETIRE_FRACTION = 0.75  # with no prompt left, drop finished rows once the live ones are at most this share


@dataclass(frozen=True)
class Request:
    """One sequence to continue: its prompt ids and how many new tokens it may take."""

    prompt_ids: tuple[int, ...]
    limit: int  # new tokens at most (>= 1)


@dataclass
class _Row:
    request: int  # index into the requests
    start: int  # first buffer column of its prompt
    generated: list[int] = field(default_factory=list)


class _SlotLayer(CacheLayerMixin):
    """One layer's keys and values in [rows, heads, columns, dim] buffers; `update` writes at the clock."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "SlotCache"):
        super().__init__()
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states) -> None:  # the buffers are allocated by SlotCache.allocate
        raise SpecwireError("continuous batching: a slot cache layer was read before its buffers were filled.")

    def update(self, key_states, value_states, *args, **kwargs):
        # key_states: [rows, heads, 1, dim]: decode steps only (prefills run on their own DynamicCache)
        t = self.owner.clock
        self.keys[:, :, t] = key_states[:, :, 0]
        self.values[:, :, t] = value_states[:, :, 0]
        return self.keys[:, :, :t + 1], self.values[:, :, :t + 1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.clock + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.clock

    def get_max_length(self) -> int:
        return -1


class SlotCache(Cache):
    """The decode cache of `generate_continuous`: a column clock shared by the rows, buffers per layer."""

    def __init__(self, num_layers: int):
        super().__init__(layers=[])
        self.layers = [_SlotLayer(self) for _ in range(num_layers)]
        self.clock = 0

    @property
    def allocated(self) -> bool:
        return self.layers[0].keys is not None

    @property
    def width(self) -> int:
        return self.layers[0].keys.shape[2]

    def allocate(self, prefill: DynamicCache, rows: int, width: int, dtype: torch.dtype | None = None) -> None:
        """Buffers shaped like `prefill`'s layers, with `rows` rows and `width` columns (zeros), in `dtype`
        (default: the prefill's)."""
        for mine, theirs in zip(self.layers, prefill.layers):
            k, v = theirs.keys, theirs.values
            mine.keys = k.new_zeros((rows, k.shape[1], width, k.shape[3]), dtype=dtype)  # shape: [rows, Hk, width, Dk]
            mine.values = v.new_zeros((rows, v.shape[1], width, v.shape[3]), dtype=dtype)  # shape: [rows, Hv, width, Dv]

    def fill(self, row: int, prefill: DynamicCache, prefill_row: int, length: int) -> None:
        """Copy the first `length` positions of `prefill_row` into columns [clock - length, clock) of `row`."""
        lo = self.clock - length
        for mine, theirs in zip(self.layers, prefill.layers):
            mine.keys[row, :, lo:self.clock] = theirs.keys[prefill_row, :, :length]
            mine.values[row, :, lo:self.clock] = theirs.values[prefill_row, :, :length]

    def shift(self, by: int) -> None:
        """Move every column `by` places (right when > 0, left when < 0); the clock moves with them."""
        if by == 0:
            return
        for layer in self.layers:
            for name in ("keys", "values"):
                buf = getattr(layer, name)
                if by > 0:
                    buf[:, :, by:self.clock + by] = buf[:, :, :self.clock].clone()
                else:
                    buf[:, :, :self.clock + by] = buf[:, :, -by:self.clock].clone()
        self.clock += by

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the buffer rows `rows` (in that order)."""
        for layer in self.layers:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.clock


def sliding_window(config) -> int | None:
    """The attention window the target applies to some of its layers, or None when all attend fully."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and not any(t == "sliding_attention" for t in types):
        return None
    return window


def supports_continuous(target: Target, longest: int) -> str | None:
    """None when `generate_continuous` can run `target` on sequences up to `longest` tokens, else why not."""
    window = sliding_window(target.model.config)
    if window is not None and window < longest:
        return (f"its sliding attention window ({window} tokens) is shorter than the longest sequence ({longest}); "
                "the slot mask does not express windows")
    return None


def _prefill(target: Target, prompts: Sequence[Sequence[int]]) -> tuple[DynamicCache, torch.Tensor]:
    """One right-padded forward over `prompts`: its cache and each prompt's last-position logits [n, V]."""
    lens = [len(p) for p in prompts]
    T = max(lens)
    dev = target.device
    ids = torch.zeros((len(prompts), T), dtype=torch.long)  # shape: [n, T], right-padded (pad id unread)
    mask = torch.zeros((len(prompts), T), dtype=torch.long)  # shape: [n, T]
    for r, p in enumerate(prompts):
        ids[r, :lens[r]] = torch.as_tensor(list(p), dtype=torch.long)
        mask[r, :lens[r]] = 1
    cache = DynamicCache()
    last = torch.as_tensor([n - 1 for n in lens], device=dev)
    out = target.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), past_key_values=cache, use_cache=True,
                       logits_to_keep=torch.unique(last))
    cols = torch.searchsorted(torch.unique(last), last)  # each row's last position among the kept ones
    logits = out.logits[torch.arange(len(prompts), device=dev), cols]  # shape: [n, V]
    return cache, logits


def _prefill_groups(order: Sequence[int], lengths: Mapping[int, int]) -> list[list[int]]:
    """`order`, shortest first, cut into groups whose padded size (rows x longest) stays within PREFILL_TOKENS."""
    groups: list[list[int]] = []
    for i in sorted(order, key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= PREFILL_TOKENS:  # i is the group's longest so far
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class _Batch:
    """The rows being decoded and the bookkeeping that keeps them aligned with the cache's rows."""

    def __init__(self, target: Target, requests: Sequence[Request], slots: int, params: SamplingParams, seed: int,
                 on_done: Callable[[int, list[int], str], None] | None):
        self.target, self.requests, self.params = target, requests, params
        self.slots = min(slots, len(requests))
        self.on_done = on_done
        self.gen = make_generator(seed, target.device) if not params.greedy else None
        self.eos = set(target.eos_token_ids)
        self.width = max(len(r.prompt_ids) + r.limit for r in requests) + COMPACT_MARGIN
        self.cache = SlotCache(target.num_layers)
        # specwire's attention computes a one-token step in fp32 (`rows_attention`): storing the keys and
        # values in fp32 (exactly: they are widened, not rounded) saves converting the whole cache each step
        invariant = getattr(target.model.config, "_attn_implementation", None) in INVARIANT_NAMES
        self.store_dtype = torch.float32 if invariant else None
        self.rows: list[_Row | None] = []  # aligned with the cache's rows; None = free
        self.pending = list(range(len(requests)))[::-1]  # a stack: the next request is pending[-1]
        self.results: list[tuple[list[int], str] | None] = [None] * len(requests)

    def shift(self, by: int) -> None:
        self.cache.shift(by)
        for r in self.rows:
            if r is not None:
                r.start += by

    def admit(self, free: list[int]) -> None:
        """Prefill the next requests into the free rows `free`, while requests are left."""
        take = {self.pending.pop(): s for s in free[:len(self.pending)]}  # request -> row
        if not take:
            return
        lengths = {i: len(self.requests[i].prompt_ids) for i in take}
        cache = self.cache
        if cache.allocated and max(lengths.values()) > cache.clock:
            self.shift(max(lengths.values()) - cache.clock)
        for group in _prefill_groups(list(take), lengths):
            pc, logits = _prefill(self.target, [self.requests[i].prompt_ids for i in group])
            if not cache.allocated:
                cache.clock = max(lengths.values())
                cache.allocate(pc, self.slots, self.width, dtype=self.store_dtype)
            first = next_token(logits, self.params, self.gen).tolist()  # shape: [len(group)]
            for r, i in enumerate(group):
                s = take[i]
                cache.fill(s, pc, r, lengths[i])
                self.rows.extend([None] * (s + 1 - len(self.rows)))
                self.rows[s] = _Row(request=i, start=cache.clock - lengths[i], generated=[first[r]])

    def retire_finished(self) -> list[int]:
        """Record every row whose last token ended it; the freed row indices."""
        free = []
        for s, row in enumerate(self.rows):
            if row is None:
                continue
            if row.generated[-1] in self.eos:
                reason = "eos"
            elif len(row.generated) >= self.requests[row.request].limit:
                reason = "length"
            else:
                continue
            self.results[row.request] = (row.generated, reason)
            if self.on_done is not None:
                self.on_done(row.request, row.generated, reason)
            self.rows[s] = None
            free.append(s)
        return free

    def drop_free_rows(self) -> None:
        live = [s for s, r in enumerate(self.rows) if r is not None]
        self.cache.keep_rows(torch.as_tensor(live, device=self.target.device))
        self.rows = [self.rows[s] for s in live]

    def step(self) -> None:
        """One decode step for every row (free rows compute on a dummy token, masked to itself)."""
        cache, dev = self.cache, self.target.device
        if cache.clock >= cache.width:  # compaction: the longest live row moves to column 0
            span = max(cache.clock - r.start for r in self.rows if r is not None)
            self.shift(span - cache.clock)
        t, n = cache.clock, len(self.rows)
        ids = torch.as_tensor([[r.generated[-1] if r else 0] for r in self.rows], device=dev)  # shape: [n, 1]
        starts = torch.as_tensor([r.start if r else t for r in self.rows], device=dev)  # shape: [n]
        positions = (t - starts).unsqueeze(1)  # shape: [n, 1]
        cols = torch.arange(t + 1, device=dev)  # shape: [t+1]
        mask = (cols.unsqueeze(0) >= starts.unsqueeze(1)).view(n, 1, 1, t + 1)  # shape: [n, 1, 1, t+1]
        out = self.target.model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache,
                                use_cache=True, logits_to_keep=1)
        cache.clock += 1
        nxt = next_token(out.logits[:, -1], self.params, self.gen).tolist()  # shape: [n]
        for s, r in enumerate(self.rows):
            if r is not None:
                r.generated.append(nxt[s])


@torch.inference_mode()
def generate_continuous(target: Target, requests: Sequence[Request], *, slots: int,
                        params: SamplingParams = SamplingParams(), seed: int = 0,
                        on_done: Callable[[int, list[int], str], None] | None = None) -> list[tuple[list[int], str]]:
    """Continue every request with continuous batching over `slots` rows; per request (ids, finish).

    The ids run up to and including the first end-of-turn token (finish "eos"), or stop at the
    request's limit ("length"). `on_done(i, ids, finish)` is called as each request finishes (in
    finishing order), so a caller can write results as they come. Sampling draws from one generator
    seeded with `seed`, so a run is reproducible for the same requests and slots.
    """
    if not isinstance(slots, int) or slots < 1:
        raise SpecwireError(f"continuous batching: slots must be a positive integer, found {slots!r}.")
    for i, r in enumerate(requests):
        if not r.prompt_ids or r.limit < 1:
            raise SpecwireError(f"continuous batching: request {i} needs a non-empty prompt and a limit >= 1, "
                                f"found {len(r.prompt_ids)} prompt tokens and limit {r.limit}.")
    if not requests:
        return []
    why = supports_continuous(target, max(len(r.prompt_ids) + r.limit for r in requests))
    if why is not None:
        raise SpecwireError(f"continuous batching cannot run target '{target.info.name}': {why}.",
                            fix="use --batching padded (HF generate on padded batches).")
    batch = _Batch(target, requests, slots, params, seed, on_done)
    results = batch.results
    batch.admit(list(range(batch.slots)))
    while True:
        free = batch.retire_finished()
        if free and batch.pending:
            batch.admit(free)
            continue  # a prefill's first token may already end its row
        live = sum(r is not None for r in batch.rows)
        if live == 0:
            break
        if not batch.pending and live <= RETIRE_FRACTION * len(batch.rows):
            batch.drop_free_rows()
        batch.step()
    del batch  # its slot cache: the largest blocks of the phase
    release_freed_memory()  # where the heap keeps freed blocks (`target.heap`), hand them back between calls
    return results

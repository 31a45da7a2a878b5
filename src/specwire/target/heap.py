"""The C heap of this process: keep freed large blocks for reuse instead of handing them back to the OS.

Scope: `keep_freed_memory`, called once by the command line's batch commands (`cli.REUSE_HEAP_COMMANDS`)
before their first large tensor; `release_freed_memory`, which hands the heap's free pages back between phases
of work; and `HEAP_ENV`, the switch that turns both off. Does not allocate, and changes no arithmetic: only
where a tensor's memory comes from.

Why: glibc serves a large allocation (above a threshold of 128 kB to 32 MB) with a fresh `mmap` and
unmaps it when it is freed. Every pass of a model on CPU allocates and frees tensors of megabytes (a
prefill's MLP activations, a batch's logits, the slot cache of continuous batching), so every such tensor
is new memory, and the kernel zeroes each of its pages on first touch. On this project's 2-core Xeon,
first-touch memory filled at about 0.6 GB/s against 15 GB/s for memory already mapped, and a
continuous-batching run of 128 rows spent a sixth of its time in those page faults.

How: `mallopt(M_MMAP_THRESHOLD, 1 GiB)` serves blocks up to 1 GiB from the heap, and
`mallopt(M_TRIM_THRESHOLD, 2 GiB)` keeps up to 2 GiB of freed heap mapped, so the next pass reuses pages
that are already there. The cost is memory: free blocks that are not at the top of the heap are never
returned, and fragmentation makes more of them. Two self-instruct builds of many shards held 11.6 GB each,
against a 3.35 GB peak for one shard, and would have run this machine out of memory. So a long job calls
`release_freed_memory` between phases (continuous batching at the end of each call, training at each
checkpoint): glibc's `malloc_trim(0)` returns every free page of the heap to the OS. The next phase faults
those pages in once, and then reuses them for all its steps. Decoding and serving gained nothing measurable,
so they keep glibc's defaults.

Limits: glibc only (Linux). Elsewhere, or with `SPECWIRE_HEAP=system` in the environment, nothing is
changed. The setting affects C allocations made after the call, so the command line makes it first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

HEAP_ENV = "SPECWIRE_HEAP"  # "system": leave glibc's defaults alone
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # bytes: blocks up to this size come from the heap, not a fresh mapping
TRIM_THRESHOLD = 2 << 30  # bytes of freed heap kept mapped for reuse


_libc: ctypes.CDLL | None = None  # set once keep_freed_memory has changed the heap


def keep_freed_memory() -> str:
    """Set glibc's heap to keep and reuse freed large blocks. Returns what was done, for logs and tests:
    "reuse" (set), "system" (turned off by SPECWIRE_HEAP=system), or "unsupported: <why>"."""
    if os.environ.get(HEAP_ENV, "").strip().lower() == "system":
        return "system"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"unsupported: {platform.system()} {platform.libc_ver()[0] or 'without glibc'}"
    global _libc
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError) as e:
        return f"unsupported: {e}"
    if not ok:
        return "unsupported: mallopt refused the thresholds"
    _libc = libc
    return "reuse"


def release_freed_memory() -> bool:
    """Return the heap's free pages to the OS, where `keep_freed_memory` changed the heap (else glibc's own
    trimming already does; nothing to do). Costs a walk of the heap: call it between phases, not per step.
    True when it ran."""
    if _libc is None:
        return False
    _libc.malloc_trim(0)
    return True

"""The compiled AMX bf16 kernel behind `--linear amx`: build, load, and the row-invariant product.

Scope: building `amxdot.c` (beside this file) into a shared library on first use, cached under
`$SPECWIRE_HOME/kernels` by a hash of the source, flags and compiler; asking Linux for the AMX tile state;
`available` (can this machine run it, and if not, why); `amxdot` (x @ W.T + b in bf16, each row bitwise
independent of the rows beside it); `source_digest` (part of the key of cached cost curves). Does not own
the module that swaps a model's linear layers (`fastlinear.AmxLinear`) nor the choice of kernel
(`decode.kernels`).

Why: on a CPU with AMX, a bf16 product over 16 or 32 rows costs about what a one-row product costs, so a
verify pass could cost about a decoding step. But oneDNN, behind `F.linear`, picks its kernel by the row
count, and reorders the weight on every call. `amxdot.c` reads the model's bf16 weights as they are and
computes every output with one fixed chain of AMX dot products over k (its header says why that makes
each row independent of the others): no row padding, and a one-token step at the machine's memory rate.
Needs: x86-64 with AMX-BF16 and AVX512-BF16, Linux (for the tile state), a C compiler with `-mamx-tile`
(gcc 11+), OpenMP.
"""

from __future__ import annotations

import ctypes
import hashlib
from functools import lru_cache
from pathlib import Path

import torch

from specwire.errors import SpecwireError
from specwire.target.cpu import x86_lacks

SOURCE = Path(__file__).with_name("amxdot.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp", "-fPIC", "-shared")
FEATURES = ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw")
ABI = 2  # `specwire_amxdot_abi()` of the source this module calls
BLOCK_N, BLOCK_K = 16, 32  # the weight's shape must be a multiple of these (the caller pads it)


def source_digest() -> str:
    """A hash of the kernel's source and flags: what cached cost curves were measured with."""
    return hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS]).encode()).hexdigest()[:16]


def cpu_lacks() -> str | None:
    return x86_lacks(FEATURES, linux=True)


@lru_cache(maxsize=None)
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why not), built once (`rowdot.open_library`)."""
    from specwire.target.rowdot import open_library

    lib, why = open_library((SOURCE,), FLAGS, source_digest(), "specwire-amx", "the AMX kernel", why_not=cpu_lacks(),
                            abi=("specwire_amxdot_abi", ABI))
    if lib is None:
        return None, why
    if lib.specwire_amx_init() != 0:
        return None, "Linux refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.specwire_amxdot_bf16.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.specwire_amxdot_bf16.restype = ctypes.c_int
    return lib, ""


def available() -> tuple[bool, str]:
    """(True, "") if this machine runs the kernel, else (False, why not: CPU, compiler, build or OS)."""
    lib, why = _library()
    return lib is not None, why


def library() -> ctypes.CDLL:
    """The loaded library; raises a SpecwireError that says why where it cannot run here."""
    lib, why = _library()
    if lib is None:
        raise SpecwireError(f"the compiled AMX kernel cannot run here: {why}.")
    return lib


def require() -> None:
    """Raise a SpecwireError that says why, when the kernel cannot run here."""
    ok, why = available()
    if not ok:
        raise SpecwireError(f"--linear amx: the compiled AMX kernel cannot run here: {why}. Use --linear torch (or auto).")


def amxdot(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N], all bf16 on CPU, each row bitwise independent of
    how many rows the call holds. N must be a multiple of 16 and K of 32 (`fastlinear.AmxLinear` pads).
    No autograd: for inference passes only."""
    lib = library()
    N, K = weight.shape
    if (x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or x.device.type != "cpu"
            or (bias is not None and bias.dtype != torch.bfloat16)):
        raise SpecwireError(f"amxdot: expected bf16 inputs, weight and bias on CPU, found {x.dtype} on {x.device} "
                            f"with a {weight.dtype} weight.")
    if x.shape[-1] != K or N % BLOCK_N or K % BLOCK_K:
        raise SpecwireError(f"amxdot: expected inputs of width {K} and a weight shape in multiples of "
                            f"[{BLOCK_N}, {BLOCK_K}], found width {x.shape[-1]} and weight [{N}, {K}].")
    w = weight if weight.is_contiguous() else weight.contiguous()
    return product(lib.specwire_amxdot_bf16, x, w, None if bias is None else bias.contiguous())


def product(fn, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel call behind `amxdot`, unchecked (the hot path of `AmxLinear`, which checks its weight once):
    fn is the library's `specwire_amxdot_bf16`, w a contiguous bf16 [N, K] in the kernel's multiples."""
    N, K = w.shape
    flat = x.reshape(-1, K)  # shape: [M, K] (a view where x is contiguous)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    y = torch.empty(*x.shape[:-1], N, dtype=torch.bfloat16)  # shape: [..., N]
    if flat.shape[0] and fn(flat.data_ptr(), flat.shape[0], K, w.data_ptr(), N,
                            None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads()):
        raise MemoryError("amxdot: no memory for the kernel's scratch")
    return y

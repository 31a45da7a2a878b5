"""The compiled AVX512-BF16 kernel behind `--dtype bfloat16 --linear rowdot`: build, load, and the row-invariant
product.

Scope: building `bf16dot.c` (beside this file) into a shared library on first use, cached under
`$SPECWIRE_HOME/kernels` by a hash of the source, flags and compiler (`rowdot.build_library`); `available` (can
this machine run it, and if not, why); `bf16dot` (x @ W.T + b in bf16, each row bitwise independent of the rows
beside it, the weight read as bf16 or as the GGUF block codes it was rebuilt from); `q8i16dot` (a served draft's
float32 product over q8_0 codes, its inputs quantized to int16 per block); `source_digest` (part of the key of
cached cost curves). Does not own the module that swaps a model's linear layers (`fastlinear.RowDotLinear`), the
compact forms (`compact`) nor the choice of kernel (`decode.kernels`).

Why: on a CPU with AVX512-BF16 but no AMX (AMD Zen 4, Intel Cooper Lake), bf16 arithmetic is twice float32's
per instruction, so a verify pass over several rows costs little more than a one-token step; but oneDNN's bf16
products read the full bf16 weights (270 MB a pass for the built-in target) and pick their kernel by the row
count. This kernel computes every output with one fixed chain of VDPBF16PS over k (its header says why that
makes each row independent of the others), and reads the built-in target's weights as their GGUF codes (112 MB),
rebuilt into the model's bf16 weight bitwise (a q4_1 block through a table of its 16 possible weights): a
one-token step cheaper than float32 rowdot's, and a curve about half as steep. Needs: x86-64 with AVX-512 (F, BW)
and AVX512-BF16, a C compiler that takes -mavx512bf16 (gcc 10+), OpenMP.
"""

from __future__ import annotations

import ctypes
import hashlib
from functools import lru_cache
from pathlib import Path

import torch

from specwire.errors import SpecwireError
from specwire.target.cpu import x86_lacks
from specwire.target.compact import CompactWeight
from specwire.target.rowdot import open_library, operands

SOURCE = Path(__file__).with_name("bf16dot.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-fopenmp", "-fPIC", "-shared")
FEATURES = ("avx512_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq")
ABI = 3  # `specwire_bf16dot_abi()` of the source this module calls
BLOCK_K = 32  # the weight's k must be a multiple of this (`fastlinear.RowDotLinear` pads a bf16 weight)


def source_digest() -> str:
    """A hash of the kernel's source and flags: what cached cost curves were measured with."""
    return hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS]).encode()).hexdigest()[:16]


def cpu_lacks() -> str | None:
    return x86_lacks(FEATURES)


@lru_cache(maxsize=None)
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why not), built once (`rowdot.open_library`)."""
    lib, why = open_library((SOURCE,), FLAGS, source_digest(), "specwire-bf16dot", "the AVX512-BF16 kernel",
                            why_not=cpu_lacks(), abi=("specwire_bf16dot_abi", ABI))
    if lib is None:
        return None, why
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.specwire_bf16dot_bf16.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, i32]
    lib.specwire_bf16dot_q4_1.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, i32]
    lib.specwire_bf16dot_q8_0.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, i32]
    lib.specwire_bf16dot_split3.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ptr, i32]
    lib.specwire_bf16dot_q8_0_i16.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, i32]
    for fn in (lib.specwire_bf16dot_bf16, lib.specwire_bf16dot_q4_1, lib.specwire_bf16dot_q8_0,
               lib.specwire_bf16dot_split3, lib.specwire_bf16dot_q8_0_i16):
        fn.restype = None
    return lib, ""


def available() -> tuple[bool, str]:
    """(True, "") if this machine runs the kernel, else (False, why not: CPU, compiler or build)."""
    lib, why = _library()
    return lib is not None, why


def library() -> ctypes.CDLL:
    """The loaded library; raises a SpecwireError that says why where it cannot run here."""
    lib, why = _library()
    if lib is None:
        raise SpecwireError(f"the compiled AVX512-BF16 kernel cannot run here: {why}.")
    return lib


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def bf16dot(x: torch.Tensor, weight: torch.Tensor | CompactWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N], all bf16 on CPU, each row bitwise independent of how
    many rows the call holds. The weight is bf16, or a q4_1 / q8_0 `compact.CompactWeight` (bitwise the product
    over its `.float()` rounded to bf16). K must be a multiple of 32. No autograd: for inference passes only."""
    lib = library()
    compact = isinstance(weight, CompactWeight)
    if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or (bias is not None and bias.dtype != torch.bfloat16)
            or not (weight.form in ("q4_1", "q8_0") if compact else weight.dtype == torch.bfloat16)):
        found = f"a {weight.form} compact weight" if compact else f"a {weight.dtype} weight"
        raise SpecwireError(f"bf16dot: expected bf16 inputs (and bias) on CPU with a bf16, q4_1 or q8_0 weight, found "
                            f"{x.dtype} on {x.device} with {found}.")
    x, b, y, M, N, K = operands("bf16dot", x, weight.shape, bias, torch.bfloat16, block=BLOCK_K)
    threads = torch.get_num_threads()
    if not M:
        pass
    elif compact and weight.form == "q4_1":
        lib.specwire_bf16dot_q4_1(x.data_ptr(), M, K, weight.codes.data_ptr(), weight.d.data_ptr(),
                                  weight.m.data_ptr(), N, _ptr(b), y.data_ptr(), threads)
    elif compact:
        lib.specwire_bf16dot_q8_0(x.data_ptr(), M, K, weight.codes.data_ptr(), weight.d.data_ptr(), N, _ptr(b),
                                  y.data_ptr(), threads)
    else:
        w = weight if weight.is_contiguous() else weight.contiguous()
        lib.specwire_bf16dot_bf16(x.data_ptr(), M, K, w.data_ptr(), N, _ptr(b), y.data_ptr(), threads)
    return y


def split3dot(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N]: float32 x, bias and output, a bf16 weight, on CPU. Each
    input row goes through the kernel as three bf16 rows that sum to it exactly (`bf16dot.c` says how), so the
    products are exact and only the order of the float32 sum differs from `rowdot.rowdot` over the same weight; each
    row is still bitwise independent of how many rows the call holds. For a served draft, which needs float32
    inputs, not rowdot's bitwise sums. K must be a multiple of 32. No autograd."""
    lib = library()
    if (x.dtype != torch.float32 or x.device.type != "cpu" or weight.dtype != torch.bfloat16
            or (bias is not None and bias.dtype != torch.float32)):
        raise SpecwireError(f"split3dot: expected float32 inputs (and bias) on CPU with a bf16 weight, found {x.dtype} "
                            f"on {x.device} with a {weight.dtype} weight.")
    x, b, y, M, N, K = operands("split3dot", x, weight.shape, bias, torch.float32, block=BLOCK_K)
    w = weight if weight.is_contiguous() else weight.contiguous()
    if M:
        parts = torch.empty(M, 3, K, dtype=torch.bfloat16)  # the kernel writes each row's three parts here
        lib.specwire_bf16dot_split3(x.data_ptr(), M, K, w.data_ptr(), N, _ptr(b), y.data_ptr(), parts.data_ptr(),
                                    torch.get_num_threads())
    return y


def q8i16dot(x: torch.Tensor, weight: CompactWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N]: float32 x, bias and output, a q8_0 `CompactWeight`, on
    CPU. Each input row is quantized per block of 32 k to int16 and each block's products summed exactly in int32
    (`bf16dot.c` says how): lossy in the inputs (each within 2^-16 of its block's largest magnitude), so for a served
    draft only, which needs neither exact inputs nor bitwise sums; each row is still independent of how many rows the
    call holds. K must be a multiple of 32. No autograd."""
    lib = library()
    if (x.dtype != torch.float32 or x.device.type != "cpu" or not isinstance(weight, CompactWeight)
            or weight.form != "q8_0" or (bias is not None and bias.dtype != torch.float32)):
        found = f"a {weight.form} compact weight" if isinstance(weight, CompactWeight) else f"a {weight.dtype} weight"
        raise SpecwireError(f"q8i16dot: expected float32 inputs (and bias) on CPU with q8_0 codes, found {x.dtype} on "
                            f"{x.device} with {found}.")
    x, b, y, M, N, K = operands("q8i16dot", x, weight.shape, bias, torch.float32, block=BLOCK_K)
    if M:
        xq = torch.empty(M, K, dtype=torch.int16)  # the kernel writes the quantized rows here, and their scales
        xs = torch.empty(M, K // BLOCK_K, dtype=torch.float32)
        lib.specwire_bf16dot_q8_0_i16(x.data_ptr(), M, K, weight.codes.data_ptr(), weight.d.data_ptr(), N, _ptr(b),
                                      y.data_ptr(), xq.data_ptr(), xs.data_ptr(), torch.get_num_threads())
    return y

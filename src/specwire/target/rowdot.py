"""The compiled row-invariant float32 kernels: build, load, and the product behind `--linear rowdot`.

Scope: building `rowdot.c`, `rowattn.c`, `argmax.c` and `rownorm.c` (beside this file, sharing `rowkernels.h`)
into one shared library on first use, cached under `$SPECWIRE_HOME/kernels` by a hash of the sources, flags and
compiler; loading it with ctypes; `available` (can this machine run it, and if not, why); `rowdot` (x @ W.T + b
through it, W float32, bf16 or an exact `compact.CompactWeight`), `operands` (the inputs and output of a compiled
product, shared with `bf16dot`), `argmax_rows` (the greedy pick over rows of
logits, for `decode.sampling.greedy_token`) and `library` (for the other kernels' callers: `attention.compiled_attention`
and `rownorm`). Does not own the module that swaps a model's linear layers (`fastlinear.RowDotLinear`), the
attention's rule (`attention`), the norm's module (`rownorm`) nor the choice of kernel (`decode.kernels`).

Why: speculation is lossless only if a T-token verify pass gives each row bitwise the logits of a
one-token step. A BLAS library picks its kernel and its blocking of the inner dimension by the number
of rows, so a row's sum changes with the rows beside it; padding every product to a fixed row multiple
restores invariance but turns each one-token step into a small matrix product, which on a CPU without
native bf16 costs about 1.5x the matrix-vector product it replaces. The kernel in `rowdot.c` computes
every output as one fixed chain of fused multiply-adds (its header says which), so it needs no padding,
and it reads each weight row once for a block of rows, so a pass of a few rows costs about one read of
the weights. A one-token step is bound by that read, so the kernel also reads weights held exactly in
fewer bytes (`target.compact`), rebuilding each float32 weight bitwise as it loads it. Where the CPU has
AVX-512, `isa` picks the build that holds two outputs' chains in one register: bitwise the same products,
for half the instructions. Needs: x86-64 with AVX2 and FMA, a C compiler (`$CC`, else `cc` or `gcc`),
OpenMP.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from specwire.errors import SpecwireError
from specwire.target.compact import CompactWeight

log = logging.getLogger("specwire")
SOURCES = tuple(Path(__file__).with_name(name) for name in ("rowdot.c", "rowattn.c", "argmax.c", "rownorm.c"))  # one library
HEADERS = (Path(__file__).with_name("rowkernels.h"),)  # included by the sources (part of their digest)
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared")  # no -ffast-math: the order is the point
# The builds, by instruction set: the same chains of operations (so bitwise the same products), the avx512
# build holding two outputs' chains in one register (rowdot.c says how), for twice the work an instruction.
ISA_FLAGS = {"avx2": FLAGS,
             "avx512": FLAGS + ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-DSPECWIRE_AVX512")}
ISA_FEATURES = {"avx2": ("avx2", "fma"), "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl")}
ISA_ENV = "SPECWIRE_ROWDOT_ISA"  # set to avx2 to build the AVX2 kernels on a CPU with AVX-512
ABI = 7  # `specwire_rowdot_abi()` of the sources this module calls


def isa() -> str:
    """The build this process uses: $SPECWIRE_ROWDOT_ISA if set (avx2 or avx512), else the widest this CPU runs."""
    from specwire.target.cpu import cpu_features

    chosen = os.environ.get(ISA_ENV, "").strip().lower()
    if chosen:
        if chosen not in ISA_FLAGS:
            raise SpecwireError(f"{ISA_ENV}: expected one of {', '.join(ISA_FLAGS)}, found {chosen!r}.")
        return chosen
    f = cpu_features()
    return "avx512" if all(f.get(name) for name in ISA_FEATURES["avx512"]) else "avx2"


def source_digest(build: str | None = None) -> str:
    """A hash of the kernels' sources and the flags of a build (this process's by default): what the cost
    curves cached under SPECWIRE_HOME were measured with."""
    flags = ISA_FLAGS[build or isa()]
    return hashlib.sha256("\0".join([*(f.read_text() for f in SOURCES + HEADERS), *flags]).encode()).hexdigest()[:16]


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc or gcc on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_library(sources: tuple[Path, ...], flags: tuple[str, ...], digest: str, prefix: str,
                  what: str) -> tuple[ctypes.CDLL | None, str]:
    """(the shared library of `sources` built with `flags`, loaded, "") or (None, why not). Built once per
    `digest` (of sources and flags) and compiler, atomically, and cached as $SPECWIRE_HOME/kernels/PREFIX-HASH.so.
    Shared by the compiled kernels (`rowdot`, `amx`)."""
    from specwire.safeio import atomic_path, specwire_home

    cc = compiler()
    if cc is None:
        return None, "no C compiler was found (set CC, or install gcc)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"the C compiler {cc} does not run ({e})"
    key = hashlib.sha256("\0".join([digest, cc, *version]).encode()).hexdigest()[:16]
    lib_path = specwire_home() / "kernels" / f"{prefix}-{key}.so"
    if not lib_path.is_file():
        log.info("building %s with %s (once; cached as %s)", what, cc, lib_path)
        try:
            with atomic_path(lib_path) as tmp:
                done = subprocess.run([cc, *flags, *map(str, sources), "-o", str(tmp)], capture_output=True,
                                      text=True, timeout=300)
                if done.returncode != 0:
                    raise RuntimeError((done.stderr.strip().splitlines() or ["no message"])[-1])
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            return None, f"{cc} could not build {' and '.join(src.name for src in sources)} ({e})"
    try:
        return ctypes.CDLL(str(lib_path)), ""
    except OSError as e:
        return None, f"{lib_path} does not load ({e})"


def open_library(sources: tuple[Path, ...], flags: tuple[str, ...], digest: str, prefix: str, what: str, *,
                 why_not: str | None, abi: tuple[str, int]) -> tuple[ctypes.CDLL | None, str]:
    """`build_library`, unless `why_not` already says this machine cannot run it, then the library's interface
    version checked: (the library, "") or (None, why not). `abi`: (the version function's name, the version this
    specwire calls). Shared by the compiled kernels (`rowdot`, `amx`, `bf16dot`)."""
    if why_not:
        return None, why_not
    lib, why = build_library(sources, flags, digest, prefix, what)
    if lib is None:
        return None, why
    if getattr(lib, abi[0])() != abi[1]:
        return None, f"{lib._name} has another interface version than this specwire"
    return lib, ""


def _cpu_ok(build: str) -> str | None:
    from specwire.target.cpu import x86_lacks

    return x86_lacks(ISA_FEATURES[build], suffix=f" (the {build} build)")


@lru_cache(maxsize=None)
def _library(build: str | None = None) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library of a build, this process's by default, "") or (None, why not). Built once per
    source/flags/compiler, atomically; the default build is resolved once per process."""
    try:
        build = build or isa()
    except SpecwireError as e:
        return None, str(e)
    lib, why = open_library(SOURCES, ISA_FLAGS[build], source_digest(build), "specwire-kernels",
                            "the row-invariant kernels", why_not=_cpu_ok(build), abi=("specwire_rowdot_abi", ABI))
    if lib is None:
        return None, why
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.specwire_rowdot_f32.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.specwire_rowdot_f32.restype = None
    lib.specwire_rowdot_bf16w.argtypes = lib.specwire_rowdot_f32.argtypes
    lib.specwire_rowdot_bf16w.restype = None
    lib.specwire_rowdot_q4_1.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.specwire_rowdot_q4_1.restype = None
    lib.specwire_rowdot_q8_0.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.specwire_rowdot_q8_0.restype = None
    lib.specwire_rowattn_f32.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64, i64,
                                         ptr, ctypes.c_float, ptr, ptr, ctypes.c_int]
    lib.specwire_rowattn_f32.restype = None
    lib.specwire_rowattn_bf16kv.argtypes = lib.specwire_rowattn_f32.argtypes
    lib.specwire_rowattn_bf16kv.restype = None
    lib.specwire_argmax_rows.argtypes = [ptr, i64, i64, ctypes.c_int, ptr, ctypes.c_int]
    lib.specwire_argmax_rows.restype = None
    lib.specwire_rmsnorm.argtypes = [ptr, i64, i64, ctypes.c_int, ptr, ctypes.c_int, ctypes.c_float, ptr]
    lib.specwire_rmsnorm.restype = None
    return lib, ""


def library(build: str | None = None) -> ctypes.CDLL:
    """The loaded library (of `build`, this process's by default); raises a SpecwireError that says why where it
    cannot run here."""
    lib, why = _library(build)
    if lib is None:
        raise SpecwireError(f"the compiled row-invariant kernels cannot run here: {why}.")
    return lib


def available() -> tuple[bool, str]:
    """(True, "") if this machine runs the kernel, else (False, why not: CPU, compiler or build)."""
    lib, why = _library()
    return lib is not None, why


def require() -> None:
    """Raise a SpecwireError that says why, when the kernel cannot run here."""
    ok, why = available()
    if not ok:
        raise SpecwireError(f"--linear rowdot: the compiled row-invariant kernel cannot run here: {why}. "
                            "Use --linear torch (or auto).")


def operands(what: str, x: torch.Tensor, shape, bias: torch.Tensor | None, out_dtype: torch.dtype, *,
             block: int = 1):
    """(x contiguous, the bias contiguous or None, y [..., N] of `out_dtype`, M, N, K) for a compiled product of x
    [..., K] by a weight of `shape` [N, K] (`rowdot`, `bf16dot`). Each tensor op costs microseconds and a pass makes
    hundreds of these calls: a contiguous x is M rows of K at its own pointer, and y is made in its final shape, with
    no reshape or view either side. The caller keeps the bias it returns alive while the kernel reads it. Refuses a
    width that is not the weight's, or not a multiple of `block`."""
    N, K = shape
    if x.shape[-1] != K or K % block:
        multiple = f", a multiple of {block}" if block > 1 else ""
        raise SpecwireError(f"{what}: expected inputs of width {K}{multiple}, found {x.shape[-1]}.")
    x = x if x.is_contiguous() else x.contiguous()
    b = None if bias is None else bias if bias.is_contiguous() else bias.contiguous()
    return x, b, torch.empty(*x.shape[:-1], N, dtype=out_dtype), x.numel() // K, N, K


def rowdot(x: torch.Tensor, weight: torch.Tensor | CompactWeight, bias: torch.Tensor | None = None, *,
           build: str | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) -> [..., N], float32 on CPU, each row bitwise independent
    of how many rows the call holds. The weight is float32, bfloat16 (widened as it is read: bitwise the
    float32 product over weight.float(), at half the bytes) or a `compact.CompactWeight` (bitwise the
    product over its `.float()`, at its bytes). `build` names the library (`ISA_FLAGS`; default: this
    process's). No autograd: for inference passes only."""
    lib = library(build)
    compact = isinstance(weight, CompactWeight)
    if (x.dtype != torch.float32 or x.device.type != "cpu" or (bias is not None and bias.dtype != torch.float32)
            or not (compact or weight.dtype in (torch.float32, torch.bfloat16))):
        found = f"a {weight.form} compact weight" if compact else f"a {weight.dtype} weight"
        raise SpecwireError(f"rowdot: expected float32 inputs (and bias) on CPU with a float32, bfloat16 or compact "
                            f"weight, found {x.dtype} on {x.device} with {found}.")
    x, held, y, M, N, K = operands("rowdot", x, weight.shape, bias, torch.float32)
    b, threads = None if held is None else held.data_ptr(), torch.get_num_threads()
    if not M:
        pass
    elif compact and weight.form == "q4_1":
        lib.specwire_rowdot_q4_1(x.data_ptr(), M, K, weight.codes.data_ptr(), weight.d.data_ptr(),
                                 weight.m.data_ptr(), N, b, y.data_ptr(), threads)
    elif compact and weight.form == "q8_0":
        lib.specwire_rowdot_q8_0(x.data_ptr(), M, K, weight.codes.data_ptr(), weight.d.data_ptr(), N, b,
                                 y.data_ptr(), threads)
    else:
        w = weight.codes if compact else weight if weight.is_contiguous() else weight.contiguous()
        fn = lib.specwire_rowdot_bf16w if w.dtype == torch.bfloat16 else lib.specwire_rowdot_f32
        fn(x.data_ptr(), M, K, w.data_ptr(), N, b, y.data_ptr(), threads)
    return y


def argmax_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """logits [..., V] (float32 or bf16, on CPU) -> [...] long: the first index of each row's maximum, as
    torch.argmax gives it, by the compiled kernel (`argmax.c`); None where it cannot answer (another dtype or
    device, the kernels not built here, or a NaN in a row: torch's argmax decides those)."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.bfloat16) or not logits.shape[-1]:
        return None
    lib, _ = _library()
    if lib is None:
        return None
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)  # shape: [R, V]
    flat = flat if flat.is_contiguous() else flat.contiguous()
    out = torch.empty(flat.shape[0], dtype=torch.long)
    lib.specwire_argmax_rows(flat.data_ptr(), flat.shape[0], V, int(flat.dtype == torch.bfloat16), out.data_ptr(),
                             torch.get_num_threads())
    if flat.shape[0] and bool((out < 0).any()):
        return None
    return out.view(logits.shape[:-1])

"""The CPU this process runs on: its model name and the instruction-set features that decide kernel speed.

Scope: `cpu_model`, `cpu_features`, `native_bf16`, read from /proc/cpuinfo, and `x86_lacks` (why a compiled
x86-64 kernel needing some features cannot run here). The bottom of the target layer: the compiled kernels
(`rowdot`, `amx`, `bf16dot`: can they run here?) and `hardware` (the key of a cached cost curve) read it. Does
not measure anything.
"""

from __future__ import annotations

import platform
from pathlib import Path

_FEATURE_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_features() -> dict[str, bool]:
    """Which of the instruction-set features that decide kernel speed this CPU has (amx_bf16, avx512_bf16...)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {f: f in flags for f in _FEATURE_FLAGS}


def native_bf16(features: dict[str, bool] | None = None) -> bool:
    """Does this CPU do bf16 arithmetic in hardware (AMX or AVX512-BF16)?"""
    f = cpu_features() if features is None else features
    return bool(f.get("amx_bf16") or f.get("avx512_bf16"))


def x86_lacks(features: tuple[str, ...], *, linux: bool = False, suffix: str = "") -> str | None:
    """Why a compiled x86-64 kernel (Linux-only where `linux`) that needs `features` cannot run on this machine, or
    None where it can; `suffix` is appended to the missing-features reason."""
    system, machine = platform.system(), platform.machine()
    if machine.lower() not in ("x86_64", "amd64") or (linux and system != "Linux"):
        return (f"it is written for x86-64 Linux and this is {system} on {machine}" if linux else
                f"it is written for x86-64 and this machine is {machine}")
    f = cpu_features()
    missing = [name for name in features if not f.get(name)]
    return f"this CPU lacks {' and '.join(missing)}{suffix}" if missing else None

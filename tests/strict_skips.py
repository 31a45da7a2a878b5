"""A skipped test proves nothing: under `make test` (SPECWIRE_STRICT_SKIPS=1) a skip fails the run,
unless its reason matches the short allow-list below.

Allowed: hardware this machine may lack (CUDA; AMX, which the `--linear amx` kernel needs). Everything else that can skip (a missing optional
peer package, a missing shipped asset) is installed or built by the project's own files, so a skip
there means the set-up is broken and the run must say so.
"""

from __future__ import annotations

import os
import re

import pytest

ALLOWED_SKIP_REASONS = (
    re.compile(r"\bCUDA\b|\bGPU\b", re.I),  # tests of the CUDA path on a machine without one
    re.compile(r"^this CPU has no AMX\b"),  # tests of the AMX kernel on a CPU without AMX-BF16 (`target.amx`)
    re.compile(r"^this CPU has no AVX512-BF16\b"),  # the bf16 rowdot kernel on a CPU without it (`target.bf16dot`)
)
STRICT_ENV = "SPECWIRE_STRICT_SKIPS"

_refused: list[tuple[str, str]] = []


def skip_allowed(reason: str) -> bool:
    return any(p.search(reason) for p in ALLOWED_SKIP_REASONS)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        if not skip_allowed(reason):
            _refused.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _refused and os.environ.get(STRICT_ENV) == "1" and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config) -> None:
    if _refused and os.environ.get(STRICT_ENV) == "1":
        terminalreporter.section("skips outside the allow-list (tests/strict_skips.py): the run fails", red=True)
        for nodeid, reason in _refused:
            terminalreporter.line(f"{nodeid}: {reason}")

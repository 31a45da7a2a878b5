"""The bench's record of measured runs, so that a long `specwire bench` resumes after an interruption.

Owns: `runs.jsonl` in the run folder (a header line with the settings and the machine, then one line
per finished prompt holding every method's run on it and when it was measured), appending a prompt
durably (flush + fsync; a partial last line left by a crash is cut on resume), and refusing to resume a
record made with other settings or on another machine, naming what differs.

Does not own: running the methods (`bench.run`), the settings themselves (`bench.config`) or
summarising the runs (`bench.summary`).

The unit of resumption is a whole prompt: all methods of a prompt are timed in one process, one after
another, so a resumed run stays side by side. Timings from different machines never mix: the record
keeps the machine it was measured on, and the build of the compiled kernels, and a resume elsewhere (or
after the kernels changed) is refused. A larger `--limit` extends a
finished run with more prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specwire.errors import SpecwireError
from specwire.safeio import append_line, cut_partial_line, write_text

RUNS_FILE = "runs.jsonl"
FORMAT = "specwire-bench-runs"
VERSION = 1
# Machine fields that must match for timings to be comparable.
# what timings depend on besides the settings: the machine, and the build of the compiled kernels that ran
MACHINE_KEYS = ("torch", "transformers", "cpu", "cpu_count", "threads", "device", "dtype", "linear", "gpu", "kernels",
                "weights_read_mb", "draft_products")
FRESH_FIX = "rerun with the recorded settings to resume it, or pass --fresh (or another --out) to measure again."


@dataclass
class RunRecord:
    """What an existing runs.jsonl holds."""

    settings: dict[str, Any]  # the bench settings that produced it (resume-free fields left out)
    machine: dict[str, Any]  # machine_info of the process that wrote the header
    prompts: dict[str, list[dict]]  # prompt id -> that prompt's runs (one dict per method), in file order
    measured_at: dict[str, str] = field(default_factory=dict)  # prompt id -> UTC ISO time (absent in older lines)

    def sittings(self) -> str:
        """When the prompts were measured, as dates: '' when unrecorded, 'on D' or 'between D1 and D2'."""
        days = sorted({t[:10] for t in self.measured_at.values()})
        if not days:
            return ""
        return f"on {days[0]}" if len(days) == 1 else f"between {days[0]} and {days[-1]}"


def _differences(recorded: Mapping[str, Any], now: Mapping[str, Any], keys: Sequence[str] | None = None) -> list[str]:
    keys = sorted(set(recorded) | set(now)) if keys is None else keys
    return [f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]


def start_record(path: Path, *, settings: Mapping[str, Any], machine: Mapping[str, Any]) -> None:
    """Write a new runs.jsonl holding only its header (atomically, replacing any older record)."""
    header = {"format": FORMAT, "version": VERSION, "settings": dict(settings), "machine": dict(machine)}
    write_text(path, json.dumps(header, separators=(",", ":")) + "\n")


def append_prompt(path: Path, prompt_id: str, runs: Sequence[Mapping[str, Any]]) -> None:
    """Record every method's run on one prompt as one durable line, stamped with the time (UTC)."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    line = json.dumps({"prompt_id": prompt_id, "measured_at": now, "runs": [dict(r) for r in runs]},
                      separators=(",", ":")) + "\n"
    append_line(path, line.encode())


def read_record(path: Path) -> RunRecord:
    """Parse runs.jsonl after cutting a partial last line; raises SpecwireError naming the line at fault."""
    lines = cut_partial_line(path).split(b"\n")[:-1]
    fix = f"delete {path} (or pass --fresh) to measure again."
    records = []
    for n, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpecwireError(f"{path}:{n}: not valid JSON ({e}); the file is corrupt.", fix=fix) from None
        if not isinstance(obj, dict):
            raise SpecwireError(f"{path}:{n}: expected a JSON object, found {type(obj).__name__}.", fix=fix)
        records.append(obj)
    if not records or records[0].get("format") != FORMAT:
        found = records[0].get("format") if records else "an empty file"
        raise SpecwireError(f"{path}:1: expected a header with format {FORMAT!r}, found {found!r}.", fix=fix)
    header = records[0]
    if header.get("version") != VERSION:
        raise SpecwireError(f"{path}:1: record version {header.get('version')!r}; this specwire reads version {VERSION}.", fix=fix)
    prompts: dict[str, list[dict]] = {}
    measured_at: dict[str, str] = {}
    for n, rec in enumerate(records[1:], start=2):
        pid, runs = rec.get("prompt_id"), rec.get("runs")
        if not isinstance(pid, str) or not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise SpecwireError(f"{path}:{n}: expected {{\"prompt_id\": str, \"runs\": [object, ...]}}, found keys "
                                f"{sorted(rec)}.", fix=fix)
        if pid in prompts:
            raise SpecwireError(f"{path}:{n}: prompt {pid!r} is recorded twice.", fix=fix)
        prompts[pid] = runs
        if isinstance(rec.get("measured_at"), str):
            measured_at[pid] = rec["measured_at"]
    return RunRecord(dict(header.get("settings") or {}), dict(header.get("machine") or {}), prompts, measured_at)


def resume_record(path: Path, *, settings: Mapping[str, Any], machine: Mapping[str, Any],
                  prompt_tokens: Mapping[str, int], methods: Sequence[str],
                  upgrade: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None) -> RunRecord | None:
    """The record of the runs already measured for this bench, restricted to its prompts; None when there is none.

    Refuses (SpecwireError) a record made with other settings or on another machine, or one whose
    prompts no longer match the prompt source (`prompt_tokens`: id -> templated length now). Recorded
    prompts outside `prompt_tokens` (a smaller --limit) are left out of the answer, not dropped from the file.
    `upgrade` restates the recorded settings in today's terms before they are compared (older records).
    """
    if not path.exists():
        return None
    rec = read_record(path)
    if upgrade is not None:
        rec.settings = upgrade(rec.settings)
    diffs = _differences(rec.settings, settings)
    if diffs:
        raise SpecwireError(f"{path} records a bench with other settings ({'; '.join(diffs)}).", fix=FRESH_FIX)
    diffs = _differences(rec.machine, machine, MACHINE_KEYS)
    if diffs:
        raise SpecwireError(f"{path} was measured on another machine or build ({'; '.join(diffs)}); timings from "
                            "different machines or kernels are never mixed.",
                            fix="pass --fresh (or another --out) to measure here.")
    done = {pid: runs for pid, runs in rec.prompts.items() if pid in prompt_tokens}  # a smaller --limit uses a prefix
    for pid, runs in done.items():
        found = sorted(str(r.get("method")) for r in runs)
        if found != sorted(methods):
            raise SpecwireError(f"{path}: prompt {pid!r} holds runs of {found}; this bench runs {sorted(methods)}.", fix=FRESH_FIX)
        bad = [r.get("prompt_tokens") for r in runs if r.get("prompt_id") != pid or r.get("prompt_tokens") != prompt_tokens[pid]]
        if bad:
            raise SpecwireError(f"{path}: prompt {pid!r} was recorded at {bad[0]!r} tokens; it is {prompt_tokens[pid]} "
                                "tokens now (the prompt source or chat template changed).", fix=FRESH_FIX)
    when = {pid: t for pid, t in rec.measured_at.items() if pid in done}
    return RunRecord(rec.settings, rec.machine, done, when)

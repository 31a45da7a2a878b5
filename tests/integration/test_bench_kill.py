"""A `specwire bench` killed with SIGKILL resumes from its record (runs.jsonl), as an uninterrupted run would report.

The bench runs as a subprocess on a tiny target with a random tiny draft; as soon as its record holds a
finished prompt it is killed (kill -9: no cleanup, no flush, possibly in the middle of an append). The
same command, rerun, must find a valid record, measure only the missing prompts and report every
prompt, with the same tokens and accept lengths as a run that was never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwire.bench.record import RUNS_FILE, read_record
from specwire.decode.engine import SpecConfig

from helpers import random_tiny_draft

if sys.platform == "win32":  # pragma: no cover
    pytest.skip("SIGKILL is POSIX", allow_module_level=True)

N_PROMPTS = 12
METHODS = "plain,eagle3-chain,eagle3-tree"
SPEC = SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=6)
MAX_NEW_TOKENS = 16


def _prompt_file(path: Path) -> Path:
    words = ["sea", "stone", "river", "light", "cloud", "word", "abc", "tree"]
    lines = [json.dumps({"prompt": " ".join(words[(i + j) % len(words)] for j in range(3 + i % 5))}) for i in range(N_PROMPTS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _finished_prompts(path: Path) -> int:
    """Prompts whose line is complete in the record (the header excluded)."""
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def _recorded_outputs(path: Path) -> dict[tuple[str, str], list[int]]:
    rec = read_record(path)
    return {(r["method"], pid): r["output_ids"] for pid, runs in rec.prompts.items() for r in runs}


@pytest.mark.slow  # three bench subprocesses (a torch import each)
def test_a_bench_killed_with_sigkill_resumes_and_reports_what_an_uninterrupted_run_reports(tiny_llama_target, tmp_path):
    draft = random_tiny_draft(tiny_llama_target, tmp_path / "draft")
    prompts = _prompt_file(tmp_path / "prompts.jsonl")
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "specwire", "bench", "--target", str(tiny_llama_target.info.path), "--draft", str(draft),
            "--prompts", str(prompts), "--max-new-tokens", str(MAX_NEW_TOKENS), "--methods", METHODS,
            "--num-steps", str(SPEC.num_steps), "--topk", str(SPEC.topk), "--num-draft-tokens", str(SPEC.num_draft_tokens),
            "--device", "cpu", "--threads", "1", "--warmup-tokens", "0", "--out", str(out), "--no-progress", "--json"]

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    deadline = time.monotonic() + 240
    try:
        while _finished_prompts(out / RUNS_FILE) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the bench ended before it was killed (rc {proc.returncode}): {err.decode()[-2000:]}"
    killed_at = _finished_prompts(out / RUNS_FILE)
    assert 1 <= killed_at < N_PROMPTS and not (out / "results.json").exists()
    before = _recorded_outputs(out / RUNS_FILE)  # valid after the kill: a partial last line is cut, not an error

    rerun = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    data = json.loads(rerun.stdout)
    assert data["n_prompts"] == N_PROMPTS
    assert any(n.startswith(f"resumed: {len(before) // 3} of {N_PROMPTS} prompts") for n in data["notes"]), data["notes"]
    after = _recorded_outputs(out / RUNS_FILE)
    assert len(after) == N_PROMPTS * 3 and all(after[k] == v for k, v in before.items())  # recorded prompts kept as they were
    assert json.loads((out / "results.json").read_text())["n_prompts"] == N_PROMPTS

    # the same command, never interrupted: another process, so both run under the same conditions (threads,
    # the row padding cached for this machine), as a user's two runs would
    whole = tmp_path / "whole"
    ref = subprocess.run(argv[:argv.index("--out") + 1] + [str(whole)] + argv[argv.index("--out") + 2:],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    assert _recorded_outputs(whole / RUNS_FILE) == after
    want = {r["method"]: r for r in json.loads(ref.stdout)["results"]}
    for r in data["results"]:
        assert r["lossless"] and want[r["method"]]["lossless"]
        for key in ("tokens", "accept_length", "accept_per_position"):
            assert r[key] == want[r["method"]][key], (r["method"], key)

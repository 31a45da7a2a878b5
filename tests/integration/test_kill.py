"""SIGKILL `specwire train` mid-run, also inside a checkpoint write and inside the final draft write,
then run the same command again: the final draft and the metrics equal an uninterrupted run's, bit for bit.

Each run is a fresh `specwire train` process on a tiny dump (the conftest's tiny Llama). Kill points:
  1. from outside, by timing: `kill -9` as soon as metrics.jsonl shows a training step;
  2. inside a checkpoint write: after the first safetensors file of the temporary checkpoint is written;
  3. between the two renames that swap the new checkpoint folder in (OUT/checkpoint is then missing and
     the previous one sits in `.checkpoint.old-PID`; the next run restores it);
  4. inside the final OUT/draft write.
Points 2-4 are exact: the test's own launcher (not the library) wraps `safeio.save_file` or
`Path.rename` so that the process sends itself SIGKILL right after the chosen call, which is what a
kill -9 arriving at that instant does. The library has no test hook.
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
import torch

from specwire.safeio import load_tensors

from helpers import base_config, one_thread, pattern_samples, read_metrics, write_dump

LAUNCHER = r'''
import os, signal, sys
kill = os.environ.get("SPECWIRE_TEST_KILL_AT")  # "<event>:<n>": SIGKILL right after the n-th such event
if kill:
    event, n = kill.split(":")
    seen = [0]

    def hit():
        seen[0] += 1
        if seen[0] == int(n):
            os.kill(os.getpid(), signal.SIGKILL)

    import specwire.safeio as safeio
    write = safeio.save_file

    def save_file(tensors, filename, *a, **k):
        write(tensors, filename, *a, **k)
        final_draft = "/.draft." in str(filename) and "/.checkpoint." not in str(filename)  # OUT/.draft.*/tmp/...
        if event == "tensors" or (event == "draft" and final_draft):
            hit()

    safeio.save_file = save_file
    if event == "swap":
        import pathlib
        rename = pathlib.Path.rename

        def swap(self, target):
            out = rename(self, target)
            if ".old-" in str(target):
                hit()
            return out

        pathlib.Path.rename = swap
from specwire.cli import main
sys.exit(main(sys.argv[1:]))
'''

STEPS, SAVE_EVERY = 10, 2
OPTIONS = dict(ttt_steps=2, batch_size=4, lr=3e-3, max_steps=STEPS, save_every=SAVE_EVERY, log_every=1,
               eval_max_samples=2, progress=False, device="cpu")


@pytest.fixture(scope="module")
def dump(tmp_path_factory, tiny_target, tiny_llama_target):
    root = tmp_path_factory.mktemp("kill-dump")
    return one_thread(lambda: write_dump(root / "dump", tiny_llama_target, pattern_samples(48, seed=5),
                                         target_name=str(tiny_target("llama"))))


def command(launcher: Path, dump: Path, out: Path) -> list[str]:
    return [sys.executable, str(launcher), "train", "--data", str(dump), "--out", str(out), "--ttt-steps", "2",
            "--batch-size", "4", "--lr", "3e-3", "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY),
            "--log-every", "1", "--eval-max-samples", "2", "--no-progress", "--device", "cpu", "--threads", "1"]


def run(cmd: list[str], *, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("SPECWIRE_TEST_KILL_AT", None)
    if kill_at:
        env["SPECWIRE_TEST_KILL_AT"] = kill_at
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def checkpoint_step(out: Path) -> int | None:
    p = out / "checkpoint" / "state.json"
    return json.loads(p.read_text())["step"] if p.is_file() else None


@pytest.mark.slow  # about a minute: five fresh processes import torch and transformers
def test_sigkill_anywhere_then_rerun_equals_an_uninterrupted_run(dump, tmp_path):
    launcher = tmp_path / "launch_train.py"
    launcher.write_text(LAUNCHER)
    reference = __import__("specwire.training.trainer", fromlist=["train"]).train(
        base_config(dump, tmp_path / "reference", **OPTIONS))
    assert reference.finished and reference.steps == STEPS
    out = tmp_path / "killed"
    cmd = command(launcher, dump, out)

    # 1. kill -9 from outside, by timing, as soon as a training step is logged
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("SPECWIRE_TEST_KILL_AT", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and metrics.stat().st_size > 0:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "draft").exists()

    # 2. inside a checkpoint write: the temporary holds draft.safetensors, not yet the rest
    before = checkpoint_step(out)
    r = run(cmd, kill_at="tensors:1")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert checkpoint_step(out) == before  # the old checkpoint (or none) is untouched
    assert list(out.glob(".checkpoint.*")), "the kill did not land inside the write"

    # 3. between the two renames of the checkpoint swap: OUT/checkpoint is missing for an instant
    r = run(cmd, kill_at="swap:1")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not (out / "checkpoint").exists() and list(out.glob(".checkpoint.old-*"))

    # 4. inside the final draft write (the run restores the old checkpoint and trains to the end first)
    r = run(cmd, kill_at="draft:1")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert checkpoint_step(out) == STEPS and not (out / "draft").exists()

    # the same command again finishes the run
    r = run(cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(out.glob(".checkpoint*")) and not list(out.glob(".draft*"))
    a = (reference.draft_dir / "model.safetensors").read_bytes()
    b = (out / "draft" / "model.safetensors").read_bytes()
    assert a == b  # the final weights, bit for bit
    wa, wb = load_tensors(reference.draft_dir / "model.safetensors"), load_tensors(out / "draft" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert read_metrics(out / "metrics.jsonl") == read_metrics(reference.metrics_path)

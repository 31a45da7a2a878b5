"""tools/gpu_run.sh, the prepared GPU checks, in a small dry run on this CPU (slow: the built-in target).

The script waits for a CUDA machine; this keeps it from rotting before one comes: every step (bench of every
method, held-out datagen, online training from the shipped draft, both evals) must run to rc=0 and leave
what it promises, and every method of its bench must be lossless.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["bench-float32", "datagen-mt-bench", "datagen-humaneval", "train", "eval-shipped-mt-bench",
         "eval-trained-mt-bench", "eval-shipped-humaneval", "eval-trained-humaneval"]


@pytest.mark.slow
def test_gpu_script_dry_run_on_cpu(tmp_path):
    from specwire.draft.checkpoint import shipped_draft_dir

    if not (shipped_draft_dir() / "model.safetensors").is_file():
        pytest.fail(f"the shipped draft is not installed at {shipped_draft_dir()} (tools/draft/build.sh builds it)")
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "LIMIT": "1", "NEW_TOKENS": "8", "EVAL_LIMIT": "2", "EVAL_TOKENS": "8",
           "SI_SAMPLES": "8", "SI_BATCH": "8", "VAL_SAMPLES": "8", "AUTOCAST": "--no-autocast",
           "BENCH_DTYPE": "float32", "FP32_BENCH": "0", "BUDGET_S": "1500", "OUT": str(out),
           "PY": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    for name in STEPS:
        assert f"] {name}: rc=0" in log, f"step {name} did not finish cleanly:\n{log[-3000:]}"
    assert "skipped" not in log, log[-3000:]

    with tarfile.open(out / "gpu-results.tar.gz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()}
        assert "machine.txt" in names
        bench = json.load(tar.extractfile("./bench-float32.out"))
        evals = {s: json.load(tar.extractfile(f"./{s}.out")) for s in STEPS if s.startswith("eval-")}
    assert [r["method"] for r in bench["results"]] == \
        ["hf-generate", "hf-prompt-lookup", "plain", "eagle3-chain", "eagle3-tree"]
    assert all(r["lossless"] for r in bench["results"]), [(r["method"], r["first_mismatch"]) for r in bench["results"]]
    for name, rep in evals.items():  # each eval read the held-out answers the script's datagen wrote
        assert (rep["split"], rep["n_samples"]) == ("all", 2), (name, rep)
    with tarfile.open(out / "gpu-draft.tar.xz") as tar:
        assert {"draft/config.json", "draft/model.safetensors"} <= set(tar.getnames())

"""User mistakes on the command line: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specwire.target.capture import capture_hidden_states
from specwire.errors import SpecwireError
from specwire.safeio import safetensors_header
from specwire.target.load import load_target
from specwire.wiring import validate_hs_ids


def run_cli(*args: str, module: str = "specwire", timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def run_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """The same command in this process (cheaper than a subprocess: no torch import per call)."""
    from specwire.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["specwire", *args], rc, out, err)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, and exactly one non-empty stderr line that names the problem."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("specwire "), line
    assert ": error: " in line, line
    for needle in needles:
        assert needle in line, line
    return line


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """A folder holding only a tiny BERT config (an encoder, not a causal LM)."""
    from transformers import BertConfig

    out = tmp_path_factory.mktemp("bert")
    BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
               intermediate_size=128).save_pretrained(out)
    return out


@pytest.fixture()
def tiny_copy(tiny_target, tmp_path) -> Path:
    """A private copy of the tiny Llama folder that a test may damage."""
    out = tmp_path / "target"
    shutil.copytree(tiny_target("llama"), out)
    return out


# ---- the target argument ------------------------------------------------------------------------

def test_missing_target_path(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert_clean_error(run_cli("info", str(missing)), "not found", str(missing))
    assert_clean_error(run_main(capsys, "generate", "--target", str(missing), "--prompt", "hi", "--device", "cpu"),
                       "not found")


def test_folder_without_config(tmp_path):
    (tmp_path / "weights").mkdir()
    assert_clean_error(run_cli("info", str(tmp_path / "weights")), "no config.json")


def test_target_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 16)
    assert_clean_error(run_main(capsys, "info", str(f)), "is a file")


def test_config_that_is_not_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert_clean_error(run_main(capsys, "info", str(tmp_path)), "config.json", "not valid JSON")
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    assert_clean_error(run_main(capsys, "info", str(tmp_path)), "model_type", "missing")


def test_info_on_bert_is_refused(bert_dir):
    assert_clean_error(run_cli("info", str(bert_dir)), "not a causal language model", "bert")


def test_generate_on_bert_is_refused(bert_dir, capsys):
    proc = run_main(capsys, "generate", "--target", str(bert_dir), "--prompt", "hi", "--device", "cpu")
    assert_clean_error(proc, "not a causal language model")


def test_library_refuses_bert_and_masked_lm(bert_dir, tmp_path):
    with pytest.raises(SpecwireError, match="not a causal language model"):
        load_target(bert_dir, device="cpu")
    # saved architectures that are not causal are refused even for a causal-capable model_type
    cfg = json.loads((bert_dir / "config.json").read_text())
    cfg["architectures"] = ["BertForMaskedLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecwireError, match="BertForMaskedLM"):
        load_target(tmp_path, device="cpu")


# ---- damaged weights ---------------------------------------------------------------------------

def test_truncated_safetensors(tiny_copy):
    f = tiny_copy / "model.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    proc = run_cli("generate", "--target", str(tiny_copy), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu")
    assert_clean_error(proc, "model.safetensors", "truncated")


def test_safetensors_header_claiming_a_huge_size(tiny_copy):
    f = tiny_copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[:8] = struct.pack("<Q", 2**62)
    f.write_bytes(bytes(data))
    with pytest.raises(SpecwireError, match="header claims"):
        safetensors_header(f)
    proc = run_cli("generate", "--target", str(tiny_copy), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu")
    assert_clean_error(proc, "model.safetensors", "header claims")


def test_safetensors_with_garbage_header(tiny_copy):
    f = tiny_copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:8 + n] = b"\xff" * n
    f.write_bytes(bytes(data))
    with pytest.raises(SpecwireError, match="not valid JSON"):
        safetensors_header(f)


def test_safetensors_shorter_than_its_length_field(tmp_path):
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"\x01\x02")
    with pytest.raises(SpecwireError, match="truncated"):
        safetensors_header(f)


# ---- generate's own arguments -------------------------------------------------------------------

def test_generate_negative_temperature(tiny_target):
    proc = run_cli("generate", "--target", str(tiny_target("llama")), "--prompt", "hi", "--temperature", "-0.5",
                   "--device", "cpu")
    assert_clean_error(proc, "temperature")


def test_generate_negative_lookup(tiny_target, capsys):
    proc = run_main(capsys, "generate", "--target", str(tiny_target("llama")), "--prompt", "hi", "--lookup", "-1",
                    "--device", "cpu")
    assert_clean_error(proc, "SpecConfig.lookup", "expected an integer >= 0, found -1", "--lookup 8")


def test_generate_past_the_context(tiny_target):
    # the tiny target has 256 positions
    proc = run_cli("generate", "--target", str(tiny_target("llama")), "--prompt", "hi", "--max-new-tokens", "1000",
                   "--device", "cpu")
    assert_clean_error(proc, "exceeds the target's context of 256", "--max-new-tokens")


def test_generate_works_on_a_tiny_target_through_python_dash_m_specwire(tiny_target):
    proc = run_cli("generate", "--target", str(tiny_target("llama")), "--prompt", "hi", "--max-new-tokens", "5",
                   "--device", "cpu", module="specwire")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "tokens" in proc.stderr and "stop:" in proc.stderr


def test_info_json_on_a_tiny_target(tiny_target):
    proc = run_cli("info", str(tiny_target("qwen3")), "--json", module="specwire")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["architecture"] == "Qwen3ForCausalLM"
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (8, 64, 260)
    assert info["default_wiring"]["hs"] == [2, 4, 5]
    assert info["default_wiring"]["sglang"] == [1, 3, 4]


# ---- hs ids through the library ----------------------------------------------------------------

def test_hs_ids_out_of_range_or_duplicated(tiny_llama_target):
    t = tiny_llama_target
    L = t.num_layers
    with pytest.raises(SpecwireError, match="out of range"):
        validate_hs_ids([2, 4, L + 1], L)
    with pytest.raises(SpecwireError, match="duplicates"):
        validate_hs_ids([2, 4, 4], L)
    ids = torch.tensor([t.encode_chat("hi")])
    with pytest.raises(SpecwireError, match=f"out of range 0..{L}"):
        capture_hidden_states(t.model, ids, [2, 4, L + 1], parts=t.parts)


# ---- the built-in target ------------------------------------------------------------------------

@pytest.mark.slow
def test_info_builtin_json():
    proc = run_cli("info", "smollm2-135m", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["architecture"] == "LlamaForCausalLM"
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (30, 576, 49152)
    w = info["default_wiring"]
    assert w["hs"] == [2, 15, 27]
    assert w["sglang"] == w["specforge"] == [1, 14, 26]
    assert w["vllm"] == w["speculators"] == w["eagle"] == [2, 15, 27]

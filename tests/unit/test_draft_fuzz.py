"""Fuzz: corrupted, truncated and self-contradicting draft folders are refused in one line, and nothing runs.

Each case starts from a valid tiny native draft (or its SGLang export), breaks one thing, and runs
`specwire generate --draft DIR` in-process: exit code 2, exactly one line on stderr naming the
problem, nothing generated on stdout. A few cases also go through import, export, launch-cmd and
doctor, and all-layer states dumps are fuzzed through `doctor --states`. A pickle-only folder holds a
pickle whose unpickling would create a marker file: no command may create it.
"""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specwire.cli import main
from specwire.interop.convert import export_draft

from helpers import make_native


def _cfg(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _edit_cfg(fn):
    def apply(d: Path) -> None:
        c = _cfg(d)
        fn(c)
        (d / "config.json").write_text(json.dumps(c))
    return apply


def _edit_tensors(fn):
    def apply(d: Path) -> None:
        t = load_file(str(d / "model.safetensors"))
        fn(t)
        save_file(t, str(d / "model.safetensors"))
    return apply


def _write(name: str, data: bytes):
    def apply(d: Path) -> None:
        (d / name).write_bytes(data)
    return apply


def _truncate(n: int):
    def apply(d: Path) -> None:
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-n])
    return apply


def _huge_tensor(d: Path) -> None:
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": [1 << 20, 1 << 10], "data_offsets": [0, 1 << 32]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)


def _set_block(path: tuple, value):
    def fn(c: dict) -> None:
        node = c["specwire"]
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return _edit_cfg(fn)


def _rename(src: str, dst: str):
    return _edit_tensors(lambda t: t.__setitem__(dst, t.pop(src)))


def _index_outside(d: Path) -> None:
    (d / "model.safetensors").rename(d / "part.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "../elsewhere.safetensors"}}))


# (id, what to break, the start: "native" or "sglang", a pattern the one stderr line must contain)
CASES = [
    ("config-not-json", _write("config.json", b"{not json"), "native", "not valid JSON"),
    ("config-empty", _write("config.json", b""), "native", "not valid JSON"),
    ("config-a-list", _write("config.json", b"[1, 2, 3]"), "native", "JSON object"),
    ("no-specwire-block", _edit_cfg(lambda c: c.pop("specwire")), "native", "specwire import"),
    ("block-not-an-object", _edit_cfg(lambda c: c.__setitem__("specwire", "yes")), "native", "specwire"),
    ("block-format-version", _set_block(("format_version",), 2), "native", "format_version"),
    ("block-hidden-size-a-string", _set_block(("draft_config", "hidden_size"), "64"), "native", "hidden_size"),
    ("block-unknown-field", _set_block(("draft_config", "flavour"), "x"), "native", "unknown fields"),
    ("block-ids-out-of-range", _set_block(("draft_config", "wiring", "hs_ids"), [2, 4, 99]), "native", "out of range"),
    ("block-ids-duplicated", _set_block(("draft_config", "wiring", "hs_ids"), [2, 2, 5]), "native", "duplicates"),
    ("aux-ids-other-triple", _edit_cfg(lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 6])), "native",
     r"hs \[2, 4, 6\].*trained on hs \[2, 4, 5\]"),
    ("aux-ids-beyond-target", _edit_cfg(lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 9])), "native",
     "8-layer target does not have"),
    ("aux-ids-two", _edit_cfg(lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4])), "native", r"hs \[2, 4\].*trained on hs \[2, 4, 5\]"),
    ("layer-hidden-size", _edit_cfg(lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 80)), "native",
     "hidden_size' is 80"),
    ("draft-vocab-size", _edit_cfg(lambda c: c.__setitem__("draft_vocab_size", 100)), "native", "draft_vocab_size' is 100"),
    ("target-hidden-size", _edit_cfg(lambda c: c.__setitem__("target_hidden_size", 32)), "native", "target_hidden_size' is 32"),
    ("norm-before-residual-flipped", _edit_cfg(lambda c: c.__setitem__("norm_before_residual", True)), "native",
     "norm_before_residual' is true"),
    ("layer-vocab-size", _edit_cfg(lambda c: c["transformer_layer_config"].__setitem__("vocab_size", 300)), "native", "t2d"),
    ("layer-max-positions", _edit_cfg(lambda c: c["transformer_layer_config"].__setitem__("max_position_embeddings", 64)),
     "native", "max_position_embeddings' is 64"),
    ("layer-heads", _edit_cfg(lambda c: c["transformer_layer_config"].__setitem__("num_attention_heads", 8)), "native",
     "num_attention_heads' is 8"),
    ("layer-rope-theta", _edit_cfg(lambda c: c["transformer_layer_config"].__setitem__(
        "rope_parameters", {"rope_type": "default", "rope_theta": 500000.0})), "native", "rope_parameters"),
    ("weights-missing", lambda d: (d / "model.safetensors").unlink(), "native", "no model.safetensors"),
    ("weights-truncated", _truncate(100), "native", "truncated"),
    ("weights-two-bytes", _write("model.safetensors", b"\x01\x02"), "native", "truncated"),
    ("weights-empty", _write("model.safetensors", b""), "native", "model.safetensors"),
    ("header-claims-huge", _write("model.safetensors", struct.pack("<Q", 10**15) + b"{}"), "native", "header claims"),
    ("tensor-past-the-end", _huge_tensor, "native", "fc.weight"),
    ("index-outside-folder", _index_outside, "native", "not plain .safetensors file names"),
    ("d2t-float", _edit_tensors(lambda t: t.__setitem__("d2t", t["d2t"].float())), "native", "d2t"),
    ("d2t-out-of-vocab", _edit_tensors(lambda t: t.__setitem__("d2t", t["d2t"] + 1000)), "native", "outside the target vocabulary"),
    ("t2d-wrong-length", _edit_tensors(lambda t: t.__setitem__("t2d", t["t2d"][:200])), "native", "t2d"),
    ("norm-missing", _edit_tensors(lambda t: t.pop("norm.weight")), "native", "missing tensors"),
    ("extra-tensor", _edit_tensors(lambda t: t.__setitem__("extra.weight", torch.zeros(2))), "native", "unexpected tensors"),
    ("fc-wrong-shape", _edit_tensors(lambda t: t.__setitem__("fc.weight", torch.zeros(64, 10))), "native", "fc.weight"),
    ("lm-head-rows", _edit_tensors(lambda t: t.__setitem__("lm_head.weight", torch.zeros(100, 64))), "native", "lm_head"),
    ("mixed-layout", _rename("layers.0.hidden_norm.weight", "midlayer.hidden_norm.weight"), "native", "hidden_norm"),
    ("sglang-export-as-native", lambda d: None, "sglang", "missing tensors"),
    ("sglang-ids-edited", _edit_cfg(lambda c: c["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 5])),
     "sglang", r"would feed the draft hs \[3, 5, 6\]"),
    ("sglang-hidden-size", _edit_cfg(lambda c: c.__setitem__("hidden_size", 80)), "sglang", "hidden_size' is 80"),
]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tiny_llama_target):
    root = tmp_path_factory.mktemp("fuzz-src")
    nat = make_native(root, tiny_llama_target)
    export_draft(nat, root / "sglang", fmt="sglang")
    return {"native": nat, "sglang": root / "sglang"}


def _broken(sources, tmp_path: Path, start: str, breaker) -> Path:
    d = tmp_path / "draft"
    shutil.copytree(sources[start], d)
    breaker(d)
    return d


def _refused_in_one_line(capsys, argv: list[str], pattern: str | None = None) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, out, err)
    assert len(lines) == 1 and "error" in lines[0], err
    assert out == "", out  # nothing ran, nothing was generated
    if pattern is not None:
        import re

        assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_there_are_enough_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name, breaker, start, pattern", CASES, ids=[c[0] for c in CASES])
def test_generate_refuses_in_one_line(sources, tmp_path, tiny_target, capsys, name, breaker, start, pattern):
    d = _broken(sources, tmp_path, start, breaker)
    _refused_in_one_line(capsys, ["generate", "--target", str(tiny_target("llama")), "--draft", str(d),
                                  "--prompt", "hi", "--max-new-tokens", "4"], pattern)


@pytest.mark.parametrize("name", ["aux-ids-other-triple", "layer-hidden-size", "draft-vocab-size", "weights-truncated",
                                  "config-not-json", "sglang-ids-edited"])
def test_export_import_and_launch_refuse_too(sources, tmp_path, tiny_target, capsys, name):
    _, breaker, start, _ = next(c for c in CASES if c[0] == name)
    d = _broken(sources, tmp_path, start, breaker)
    target = str(tiny_target("llama"))
    if start == "native":
        _refused_in_one_line(capsys, ["export", str(d), "--format", "speculators", "--out", str(tmp_path / "out")])
    _refused_in_one_line(capsys, ["import", str(d), "--out", str(tmp_path / "back")])
    engine = "sglang" if start == "sglang" else "vllm"
    _refused_in_one_line(capsys, ["launch-cmd", str(d), "--engine", engine, "--target", target])
    assert not (tmp_path / "out").exists() and not (tmp_path / "back").exists()


@pytest.mark.parametrize("name", ["aux-ids-other-triple", "aux-ids-beyond-target", "layer-hidden-size", "draft-vocab-size",
                                  "norm-before-residual-flipped", "sglang-ids-edited"])
def test_doctor_reports_disagreements_as_errors(sources, tmp_path, tiny_target, capsys, name):
    _, breaker, start, _ = next(c for c in CASES if c[0] == name)
    d = _broken(sources, tmp_path, start, breaker)
    rc = main(["doctor", str(d), "--target", str(tiny_target("llama")), "--no-search", "--no-online", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and not rep["ok"]
    assert any(f["id"].startswith("inconsistent-") and f["severity"] == "error" for f in rep["findings"]), rep["findings"]


@pytest.mark.parametrize("name", ["config-not-json", "weights-truncated", "header-claims-huge", "weights-missing"])
def test_doctor_refuses_unreadable_folders_in_one_line(sources, tmp_path, tiny_target, capsys, name):
    _, breaker, start, pattern = next(c for c in CASES if c[0] == name)
    d = _broken(sources, tmp_path, start, breaker)
    _refused_in_one_line(capsys, ["doctor", str(d), "--target", str(tiny_target("llama")), "--no-search", "--no-online"],
                         pattern)


class _Marker:
    """A pickle that creates a file when it is unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_pickle_only_folder_is_never_unpickled(tmp_path, tiny_target, capsys):
    marker = tmp_path / "UNPICKLED"
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {}}))
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": _Marker(marker)}, f)
    target = str(tiny_target("llama"))
    for argv in (["generate", "--target", target, "--draft", str(d), "--prompt", "hi"],
                 ["import", str(d), "--out", str(tmp_path / "back"), "--target", target],
                 ["export", str(d), "--format", "sglang", "--out", str(tmp_path / "out")],
                 ["launch-cmd", str(d), "--engine", "sglang", "--target", target],
                 ["doctor", str(d), "--target", target, "--no-search", "--no-online"]):
        line = _refused_in_one_line(capsys, argv)
        assert "pickle" in line or "never unpickles" in line or "model.safetensors" in line, line
        assert not marker.exists(), argv
    # the marker really is what unpickling would do
    with open(d / "pytorch_model.bin", "rb") as f:
        pickle.load(f)  # noqa: S301 (our own file, to prove the trap works)
    assert marker.exists()


# ---- states dumps (doctor --states) -----------------------------------------------------------------------------

def _states_dump(root: Path, manifest) -> Path:
    d = root / "states"
    d.mkdir()
    (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return d


@pytest.mark.parametrize("manifest, pattern", [
    ("{not json", "not valid JSON"),
    ({"format": "specwire-dump", "format_version": 1}, "expected 'specwire-states'"),
    ({"format": "specwire-states", "format_version": 1, "complete": False}, "incomplete"),
    ({"format": "specwire-states", "format_version": 1, "complete": True,
      "target": {"num_layers": 9, "hidden_size": 64, "vocab_size": 260, "architecture": "LlamaForCausalLM"}}, "another model"),
])
def test_doctor_refuses_broken_states_dumps(sources, tmp_path, tiny_target, capsys, manifest, pattern):
    cfg_only = tmp_path / "big-target"
    cfg_only.mkdir()
    shutil.copy(Path(tiny_target("llama")) / "config.json", cfg_only / "config.json")
    states = _states_dump(tmp_path, manifest)
    _refused_in_one_line(capsys, ["doctor", str(sources["native"]), "--target", str(cfg_only), "--states", str(states),
                                  "--no-online"], pattern)

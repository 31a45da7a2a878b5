"""The one reader (`draft.reader.read_checkpoint`): every layout and naming variant the formats tests
know, every record of the ids translated to hs indices, the consistency check, and the proof that
export, import, launch-cmd, doctor and the native loader all go through it. The slow test edits an
export of the shipped draft the three ways of the trust issue and expects generate and doctor to refuse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specwire.draft.checkpoint import load_draft
from specwire.errors import SpecwireError, WiringMismatch
from specwire.draft import reader
from specwire.interop.convert import export_draft
from specwire.draft.reader import read_checkpoint
from specwire.interop.engines import engine_reading

from helpers import make_native, read_cfg, write_cfg

L = 8  # the tiny target's layers


def _strip_block(d: Path) -> Path:
    cfg = read_cfg(d)
    del cfg["specwire"]
    write_cfg(d, cfg)
    return d


def _tensors(d: Path, fn) -> Path:
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))
    return d


def _shard(d: Path) -> Path:
    t = load_file(str(d / "model.safetensors"))
    names = sorted(t)
    a, b = names[: len(names) // 2], names[len(names) // 2:]
    save_file({k: t[k] for k in a}, str(d / "model-00001-of-00002.safetensors"))
    save_file({k: t[k] for k in b}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors").unlink()
    wm = {k: "model-00001-of-00002.safetensors" for k in a} | {k: "model-00002-of-00002.safetensors" for k in b}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return d


def _drop_vocab_map(d: Path) -> Path:
    return _tensors(d, lambda t: (t.pop("d2t"), t.pop("t2d")))


# name -> (build(root, target, target_dir) -> folder, format, layout, hs ids meant, consistent, flagged problem)
def _variants():
    def native(root, tgt, tdir, **kw):
        return make_native(root, tgt, name="native", **kw)

    def exported(fmt, **kw):
        def build(root, tgt, tdir):
            nat = make_native(root, tgt, name="src", hs_ids=kw.pop("hs_ids", None), draft_vocab=kw.pop("draft_vocab", 128),
                              norm_before_residual=kw.pop("norm_before_residual", False), dtype=kw.pop("dtype", None))
            if kw.pop("embeddings", False):
                kw["embeddings_from"] = tdir
            return export_draft(nat, root / "out", fmt=fmt, **kw).out
        return build

    def then(build, *edits):
        def run(root, tgt, tdir):
            d = build(root, tgt, tdir)
            for e in edits:
                d = e(d)
            return d
        return run

    def native_names_under_sglang_config(root, tgt, tdir):
        d = exported("sglang")(root, tgt, tdir)
        save_file(load_file(str(root / "src" / "model.safetensors")), str(d / "model.safetensors"))
        return d

    def sglang_names_under_speculators_config(root, tgt, tdir):
        d = exported("speculators")(root, tgt, tdir)
        sg = export_draft(root / "src", root / "sg", fmt="sglang").out
        save_file(load_file(str(sg / "model.safetensors")), str(d / "model.safetensors"))
        return d

    def mixed(root, tgt, tdir):
        return _tensors(native(root, tgt, tdir), lambda t: t.__setitem__("midlayer.hidden_norm.weight",
                                                                      t.pop("layers.0.hidden_norm.weight")))

    return {
        "native": (native, "native", "layers", [2, 4, 5], True, None),
        "native-bf16": (lambda r, t, d: native(r, t, d, dtype=torch.bfloat16), "native", "layers", [2, 4, 5], True, None),
        "native-norm-before-residual": (lambda r, t, d: native(r, t, d, norm_before_residual=True), "native", "layers",
                                        [2, 4, 5], True, None),
        "native-four-states": (lambda r, t, d: native(r, t, d, hs_ids=(1, 2, 4, 5)), "native", "layers", [1, 2, 4, 5], True, None),
        "speculators-export": (exported("speculators", verifier="org/target", num_speculative_tokens=3), "native", "layers",
                               [2, 4, 5], True, None),
        "speculators-export-with-embeddings": (exported("speculators", embeddings=True), "native", "layers", [2, 4, 5], True, None),
        "speculators-export-sharded": (then(exported("speculators"), _shard), "native", "layers", [2, 4, 5], True, None),
        "sglang-classic": (exported("sglang"), "sglang", "midlayer", [2, 4, 5], True, None),
        "sglang-shift-if-one": (exported("sglang", hs_ids=(3, 5, 6), sglang_version="shift-if-one"), "sglang", "midlayer",
                                [3, 5, 6], True, None),
        "sglang-embedding-id": (exported("sglang", hs_ids=(0, 4, 5)), "sglang", "midlayer", [0, 4, 5], True, None),
        "sglang-bf16-with-embeddings": (exported("sglang", dtype=torch.bfloat16, embeddings=True), "sglang", "midlayer",
                                        [2, 4, 5], True, None),
        "sglang-sharded": (then(exported("sglang"), _shard), "sglang", "midlayer", [2, 4, 5], True, None),
        "speculators-foreign": (then(exported("speculators"), _strip_block), "speculators", "layers", [2, 4, 5], True, None),
        "speculators-foreign-shared-vocab": (then(exported("speculators", draft_vocab=260), _strip_block, _drop_vocab_map),
                                             "speculators", "layers", [2, 4, 5], True, None),
        "sglang-foreign": (then(exported("sglang"), _strip_block), "sglang", "midlayer", [2, 4, 5], True, None),
        "sglang-config-native-names": (native_names_under_sglang_config, "native", "layers", [2, 4, 5], True, "silently skips"),
        "speculators-config-sglang-names": (sglang_names_under_speculators_config, "sglang", "midlayer", [2, 4, 5], True,
                                            "random layer"),
        "mixed-names": (mixed, None, "mixed", [2, 4, 5], True, "mix"),
    }


VARIANTS = _variants()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_reader_reads_every_variant(tmp_path, tiny_llama_target, tiny_target, name):
    build, fmt, layout, hs, consistent, flagged = VARIANTS[name]
    d = build(tmp_path, tiny_llama_target, str(tiny_target("llama")))
    info = read_checkpoint(d)
    assert info.format == fmt and info.layout == layout, (info.format, info.layout, info.problems)
    assert not info.read_errors
    assert (not info.inconsistencies) == consistent, info.inconsistencies
    if flagged:
        assert any(flagged in p for p in info.problems), info.problems
    # every record of the ids, in its own convention, means the same hs indices once translated
    records = info.ids_records()
    assert records and all(r.hs(L) == hs for r in records), [(r.field, r.written, r.hs(L)) for r in records]
    assert info.trained_hs(L)[0] == hs
    # widths and vocabulary from the headers
    n = len(hs)
    assert info.shape("fc.weight") == (64, n * 64) and info.hidden_size == 64
    vocab = 260 if "shared-vocab" in name else 128
    assert info.shape("lm_head.weight") == (vocab, 64)
    if "shared-vocab" not in name:
        assert info.shape("d2t") == (128,) and info.shape("t2d") == (260,)
    assert info.rope is not None and info.rope["rope_theta"] > 0
    # the engines' readings come from the same records
    if layout == "midlayer":  # read by the SGLang id rule the export was written for
        assert engine_reading(info, "sglang", L, sglang_version=info.sglang_version).hs_ids == tuple(hs)
    if layout == "layers" and "eagle_config" not in info.raw:
        assert engine_reading(info, "vllm", L).hs_ids == tuple(hs)
    if fmt == "native":
        assert info.draft_config().wiring.hs_ids == tuple(hs)


@pytest.mark.parametrize("edit, kind, pattern", [
    (lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 6]), "ids", r"trained on hs \[2, 4, 5\]"),
    (lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 9]), "ids-range", "8-layer target"),
    (lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 80), "width", "fc.weight"),
    (lambda c: c.__setitem__("draft_vocab_size", 100), "vocab", "lm_head.weight has 128 rows"),
    (lambda c: c.__setitem__("target_hidden_size", 32), "width", "fc.weight takes 192 inputs"),
    (lambda c: c.__setitem__("norm_before_residual", True), "norm-before-residual", "trained with false"),
    (lambda c: c["transformer_layer_config"].__setitem__("max_position_embeddings", 64), "geometry", "says 256"),
])
def test_consistency_check_names_both_values_and_the_readers(tmp_path, tiny_llama_target, edit, kind, pattern):
    d = make_native(tmp_path, tiny_llama_target)
    cfg = read_cfg(d)
    edit(cfg)
    write_cfg(d, cfg)
    info = read_checkpoint(d)
    assert info.inconsistencies and info.inconsistencies[0].kind == kind, info.inconsistencies
    msg = info.inconsistencies[0].message
    import re

    assert re.search(pattern, msg), msg
    assert "read" in msg and "config.json" in msg
    with pytest.raises(SpecwireError, match="Fix:") as e:
        load_draft(d)
    assert "\n" not in str(e.value)
    if kind in ("ids", "ids-range", "norm-before-residual"):
        assert isinstance(e.value, WiringMismatch)


def test_foreign_copies_of_the_ids_are_compared_for_a_known_target(tmp_path, tiny_llama_target):
    """Without a specwire block, the vLLM and the SGLang copies must agree under some SGLang rule."""
    d = make_native(tmp_path, tiny_llama_target)
    cfg = _strip_block(d) and read_cfg(d)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}  # = hs [2, 4, 5]: agrees
    write_cfg(d, cfg)
    assert read_checkpoint(d).check_consistency(L) == []
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}  # hs [3, 5, 6] or [2, 4, 5]: agrees on one rule
    write_cfg(d, cfg)
    assert read_checkpoint(d).check_consistency(L) == []
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [3, 5, 6]}
    write_cfg(d, cfg)
    (bad,) = read_checkpoint(d).check_consistency(L)
    assert bad.kind == "ids" and "[2, 4, 5]" in bad.message and "[3, 5, 6]" in bad.message


def test_every_command_reads_through_the_one_reader(tmp_path, tiny_llama_target, tiny_target, monkeypatch, capsys):
    """export, import, launch-cmd, doctor and the native loader all run the reader's consistency check."""
    from specwire.cli import main

    seen: list[Path] = []
    original = reader.find_inconsistencies

    def spy(info, num_layers=None):
        seen.append(Path(info.path))
        return original(info, num_layers)

    monkeypatch.setattr(reader, "find_inconsistencies", spy)
    target = str(tiny_target("llama"))
    nat = make_native(tmp_path, tiny_llama_target)
    for argv, folder in (
        (["export", str(nat), "--format", "sglang", "--out", str(tmp_path / "sg")], nat),
        (["export", str(nat), "--format", "speculators", "--out", str(tmp_path / "sp")], nat),
        (["import", str(tmp_path / "sg"), "--out", str(tmp_path / "back")], tmp_path / "sg"),
        (["launch-cmd", str(tmp_path / "sg"), "--engine", "sglang", "--target", target], tmp_path / "sg"),
        (["launch-cmd", str(tmp_path / "sp"), "--engine", "vllm", "--target", target], tmp_path / "sp"),
        (["doctor", str(tmp_path / "sg"), "--target", target, "--engine", "sglang", "--no-search", "--no-online"],
         tmp_path / "sg"),
    ):
        seen.clear()
        assert main(argv) == 0, capsys.readouterr()
        assert folder in seen, (argv, seen)
    foreign = _strip_block(export_draft(nat, tmp_path / "foreign", fmt="speculators").out)
    seen.clear()
    assert main(["import", str(foreign), "--out", str(tmp_path / "back2"), "--target", target]) == 0
    assert foreign in seen
    seen.clear()
    load_draft(nat)
    assert seen == [nat]


# ---- the trust issue's three edits, on the shipped draft ---------------------------------------------------------

def _shipped_edits():
    return {
        "ids-beyond-the-target": lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 15, 31]),
        "ids-another-triple": lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 14, 27]),
        "hidden-size": lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 640),
        "draft-vocab-size": lambda c: c.__setitem__("draft_vocab_size", 4096),
    }


@pytest.mark.slow
@pytest.mark.parametrize("edit", sorted(_shipped_edits()))
def test_shipped_draft_export_edited_is_refused_by_generate_and_doctor(tmp_path, capsys, edit):
    from specwire.cli import main
    from specwire.draft.checkpoint import shipped_draft_dir

    if not (shipped_draft_dir() / "config.json").is_file():
        pytest.fail(f"the shipped draft is not installed at {shipped_draft_dir()}")
    out = tmp_path / "exported"
    assert main(["export", "smollm2-135m-eagle3", "--format", "speculators", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", "--draft", str(out), "--prompt", "hi", "--max-new-tokens", "2"]) == 0  # as exported: fine
    capsys.readouterr()
    cfg = read_cfg(out)
    assert cfg["specwire"]["draft_config"]["wiring"]["hs_ids"] == [2, 15, 27]
    _shipped_edits()[edit](cfg)
    write_cfg(out, cfg)
    rc = main(["generate", "--draft", str(out), "--prompt", "hi", "--max-new-tokens", "2"])
    o, err = capsys.readouterr()
    assert rc == 2 and o == "" and len(err.strip().splitlines()) == 1, (rc, o, err)
    assert "config.json" in err and "Fix:" in err
    for extra in ([], ["--engine", "vllm"], ["--engine", "sglang"]):
        rc = main(["doctor", str(out), "--target", "smollm2-135m", "--no-search", "--no-online", "--json", *extra])
        rep = json.loads(capsys.readouterr().out)
        assert rc == 1 and not rep["ok"]
        errors = [f for f in rep["findings"] if f["severity"] == "error"]
        assert any(f["id"].startswith("inconsistent-") for f in errors), errors
    shutil.rmtree(out)

"""A `--draft` argument may be a `specwire train --out` folder: every consumer uses its draft/ and says so.

The rule lives once in `specwire.draft.checkpoint.locate_draft` (through `resolve_draft_path`, which
`load_draft`, export, launch-cmd and doctor use); `training.rundir.resolve_draft_arg` delegates to it.
Tiny offline target and a random tiny draft; no built-in model.
"""

from __future__ import annotations

import logging

import pytest

from helpers import make_draft_dir
from specwire.cli import main
from specwire.draft.checkpoint import load_draft, locate_draft, resolve_draft_path
from specwire.errors import SpecwireError
from specwire.training.rundir import RunPaths, resolve_draft_arg


@pytest.fixture
def run_folder(tiny_llama_target, tmp_path):
    """OUT with the layout `specwire train --out OUT` leaves: OUT/draft/ (a native draft), OUT/checkpoint/."""
    out = tmp_path / "run"
    make_draft_dir(tiny_llama_target, RunPaths(out).draft_dir)
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "state.json").write_text("{}")
    (out / "metrics.jsonl").write_text("")
    return out


def test_load_draft_takes_a_run_folder_and_says_so(run_folder, caplog):
    with caplog.at_level(logging.WARNING):
        draft = load_draft(run_folder)
    assert draft.config.draft_vocab_size == 128
    assert f"using {run_folder / 'draft'}" in caplog.text and "specwire train --out" in caplog.text
    assert resolve_draft_path(run_folder / "draft") == run_folder / "draft"  # a draft folder passes as is
    where = locate_draft(run_folder)
    assert where.path == run_folder / "draft" and where.note
    arg = resolve_draft_arg(run_folder)  # eval's front door delegates (and returns the note, not logs it)
    assert arg.path == str(run_folder / "draft") and arg.note == where.note
    assert resolve_draft_arg("smollm2-135m-eagle3").path == "smollm2-135m-eagle3"
    assert resolve_draft_arg(run_folder / "draft").note is None


def test_export_and_generate_take_a_run_folder(run_folder, tiny_target, tmp_path, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        assert main(["export", str(run_folder), "--format", "speculators", "--out", str(tmp_path / "sp")]) == 0
    assert (tmp_path / "sp" / "config.json").is_file()
    assert f"using {run_folder / 'draft'}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rc = main(["generate", "--target", str(tiny_target("llama")), "--draft", str(run_folder), "--prompt", "hi",
                   "--max-new-tokens", "4"])
    assert rc == 0, capsys.readouterr().err
    assert f"using {run_folder / 'draft'}" in caplog.text


def test_unfinished_run_and_other_folders_are_refused_naming_what_was_expected(tmp_path, tiny_target, capsys):
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoint").mkdir(parents=True)
    (unfinished / "checkpoint" / "state.json").write_text("{}")
    with pytest.raises(SpecwireError, match="has not finished") as e:
        load_draft(unfinished)
    assert "rerun the same `specwire train --out" in str(e.value)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    with pytest.raises(SpecwireError) as e:
        resolve_draft_path(other)
    msg = str(e.value)
    assert "expected a draft folder (config.json + model.safetensors) or a `specwire train --out` folder" in msg
    assert "draft/config.json" in msg and "notes.txt" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecwireError, match="found an empty folder"):
        resolve_draft_path(tmp_path / "empty")
    rc = main(["generate", "--target", str(tiny_target("llama")), "--draft", str(other), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "expected a draft folder" in err


"""`make draft` reproduces the shipped draft: the last stage of `tools/draft/build.sh` is the run the draft records.

The shipped draft's `config.json` keeps the training config of the run it came from. These tests read the recipe
the way bash would (each `VAR=${VAR:-default}` at its default) and check that the stage whose draft becomes
`$RUN/ship` trains on the same data, in the same order and window, with the same schedule, and stops where the
shipped run stopped; and that the self-instruct builds it reads are committed in full, and hold nothing more. A
new version shipped without its stage in the recipe, or a recipe edited without retraining, fails here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from specwire.data.dump import is_validation
from specwire.data.selfinstruct import MANIFEST, shard_name
from specwire.draft.checkpoint import shipped_draft_dir
from specwire.safeio import read_json

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "draft" / "build.sh"


def _script() -> tuple[str, dict[str, str]]:
    """build.sh with continuation lines joined, and its `VAR=${VAR:-default}` defaults."""
    text = BUILD.read_text().replace("\\\n", " ")
    defaults = dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}", text, flags=re.M))
    return text, defaults


def _expand(words: str, defaults: dict[str, str]) -> str:
    return re.sub(r'"?\$\{?(\w+)\}?"?', lambda m: defaults.get(m.group(1), m.group(0)), words)


def _shipped_stage() -> tuple[list[str], dict[str, str], int | None]:
    """The data folders, the train options (a bare flag maps to "") and the stop step of the stage whose draft
    ships."""
    text, defaults = _script()
    ship = re.search(r'^ship "\$RUN/([\w-]+)/\w+" "\$RUN/ship"', text, flags=re.M)
    assert ship, f"{BUILD}: no `ship ... \"$RUN/ship\"` line"
    run = ship.group(1)
    call = re.search(rf'^\s*online_stage "\$RUN/{run}" \S+ \S+ (.*)$', text, flags=re.M)
    assert call, f"{BUILD}: no online_stage call trains $RUN/{run}, the run that ships"
    data = re.findall(r'^SI_DATA="([^"]*)"', text[:call.start()], flags=re.M)[-1].split()
    args = shlex.split(_expand(call.group(1), defaults))
    options = {a: "" if i + 1 == len(args) or args[i + 1].startswith("--") else args[i + 1]
               for i, a in enumerate(args) if a.startswith("--")}
    stop = re.search(r"--stop-after \$\(\((\w+) - done_steps\)\)", call.group(1))
    return data, options, int(defaults[stop.group(1)]) if stop else None


def _shipped_training() -> dict:
    return read_json(shipped_draft_dir() / "config.json", what="shipped draft config")["specwire"]["training"]


def test_the_last_stage_of_make_draft_is_the_run_the_shipped_draft_records():
    data, options, stop = _shipped_stage()
    training = _shipped_training()
    config = training["config"]
    assert config["data"] == data  # the same folders, in the same order: the window is cut in data order
    for flag, key, kind in (("--seed", "seed", int), ("--lr", "lr", float), ("--max-steps", "max_steps", int),
                            ("--epochs", "epochs", float), ("--skip-train-samples", "skip_train_samples", int)):
        assert kind(options.get(flag, 0)) == kind(config[key]), f"{flag}: build.sh {options.get(flag)}, shipped {config[key]}"
    assert ("--refit-vocab" in options) == bool(config.get("refit_vocab")), "--refit-vocab: build.sh and the shipped run disagree"
    if config["max_train_samples"] is not None:
        assert int(options["--max-train-samples"]) == config["max_train_samples"]
    if stop is not None:  # a stage stopped before the end of its schedule ships the best validation up to the stop
        assert training["stopped_at_step"] == stop
        assert training["schedule_steps"] == config["max_steps"]


def test_the_data_of_the_last_stage_is_committed_in_full():
    data, options, _ = _shipped_stage()
    text, _ = _script()
    train_samples = 0
    for folder in data:
        wanted = re.search(rf"selfinstruct --out {re.escape(folder)} .*?--conversations (\d+)", text)
        assert wanted, f"{BUILD}: no `specwire selfinstruct --out {folder}` step checks the build the stage reads"
        manifest = read_json(ROOT / folder / MANIFEST, what="self-instruct manifest")
        n, size = int(wanted.group(1)), manifest["options"]["shard_size"]
        assert n % size == 0, f"{BUILD}: --conversations {n} for {folder} is not a whole number of {size}-shards"
        for s in range(n // size):
            assert (ROOT / folder / shard_name(s)).is_file(), f"{folder}: shard {s} is not committed"
        # the stage reads every shard of the folder (its window is cut in data order, a refit counts every
        # conversation), so a build grown past what the recipe names would change what it trains on
        extra = sorted(p.name for p in (ROOT / folder).glob("shard-*.jsonl.gz") if p.name >= shard_name(n // size))
        assert not extra, f"{folder}: {extra} lie past the {n} conversations the recipe names; grow a new folder"
        train_samples += sum(not is_validation(i) for i in range(n))
    window = int(options.get("--skip-train-samples", 0)) + int(options.get("--max-train-samples", 0))
    assert window <= train_samples, f"the window ends at {window}, past the {train_samples} training conversations"

"""`specwire eval`: the predicted accept length, the JSON contract, and refusals of mismatched data."""

from __future__ import annotations

import json

import pytest
import torch

from specwire.errors import SpecwireError, WiringMismatch
from specwire.training.evaluate import EvalResult, evaluate, predicted_accept_length
from specwire.training.config import TrainConfig
from specwire.training.trainer import train

from helpers import one_thread, pattern_samples, write_dump


def test_predicted_accept_length():
    assert predicted_accept_length([]) == 1.0
    assert predicted_accept_length([1.0, 1.0, 1.0]) == 4.0
    assert predicted_accept_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert predicted_accept_length([0.8, 0.0, 0.9]) == pytest.approx(1.8)
    with pytest.raises(SpecwireError, match="not a probability"):
        predicted_accept_length([1.2])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target, tiny_llama_target):
    """A small dump and a draft trained on it for a few steps (draft vocab 96 of 260: coverage < 1)."""
    root = tmp_path_factory.mktemp("eval")
    name = str(tiny_target("llama"))

    def make():
        dump = write_dump(root / "dump", tiny_llama_target, pattern_samples(101, seed=3), target_name=name)
        res = train(TrainConfig(data=str(dump), out=str(root / "run"), ttt_steps=3, batch_size=8, lr=3e-3, max_steps=12,
                                draft_vocab_size=60, progress=False))
        return dump, res

    dump, res = one_thread(make)
    return {"dump": dump, "draft": res.draft_dir, "result": res, "root": root, "name": name}


def test_eval_json_contract(trained, capsys):
    from specwire.cli import main

    rc = main(["eval", "--draft", str(trained["draft"]), "--data", str(trained["dump"]), "--json", "--ttt-steps", "3",
               "--device", "cpu"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"step_accuracy", "predicted_accept_length", "n_tokens", "draft_vocab_coverage", "n_samples"} <= set(out)
    acc = out["step_accuracy"]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc)
    assert out["predicted_accept_length"] == pytest.approx(predicted_accept_length(acc))
    assert out["n_samples"] == 3 and out["n_tokens"] > 0  # indices 0, 50, 100 are validation
    # the validation report at the end of training is the same measurement
    assert acc == pytest.approx(trained["result"].val["step_accuracy"], abs=1e-9)
    # text output names the accept length
    assert main(["eval", "--draft", str(trained["draft"]), "--data", str(trained["dump"]), "--ttt-steps", "2"]) == 0
    assert "predicted chain accept length" in capsys.readouterr().out


def test_eval_accuracies_are_consistent(trained, tiny_llama_target):
    r = evaluate(str(trained["draft"]), trained["dump"], target=tiny_llama_target, ttt_steps=4, split="all",
                 max_samples=30, device="cpu")
    assert isinstance(r, EvalResult) and r.split == "all" and r.n_samples == 30
    assert 0 < r.draft_vocab_coverage < 1  # 60 of 260 ids
    for a, adv in zip(r.step_accuracy, r.step_accuracy_draft_vocab):
        # a target-vocab hit is a draft-vocab hit; neither can beat the coverage
        assert a <= adv + 1e-12 and a <= r.draft_vocab_coverage + 1e-12
    assert r.step_tokens[0] == r.n_tokens and all(k >= 0 for k in r.step_kl)
    assert r.step_accuracy[0] > 0.1  # 12 steps on the pattern task are already well above the 1/260 chance


def test_eval_refuses_mismatched_data(trained, tiny_target, tiny_llama_target, capsys):
    from specwire.cli import main

    root = trained["root"]
    other_ids = one_thread(lambda: write_dump(root / "other-ids", tiny_llama_target, pattern_samples(4, seed=4),
                                              target_name=trained["name"], hs_ids=[1, 4, 5]))
    with pytest.raises(WiringMismatch, match=r"hidden-state ids: expected hs \[2, 4, 5\].*found hs \[1, 4, 5\]"):
        evaluate(str(trained["draft"]), other_ids, target=tiny_llama_target, device="cpu")
    rc = main(["eval", "--draft", str(trained["draft"]), "--data", str(other_ids), "--split", "all"])
    assert rc == 2 and "hidden-state ids" in capsys.readouterr().err

    from specwire.target.load import load_target

    other = load_target(tiny_target("llama", seed=1), device="cpu")
    other_target = one_thread(lambda: write_dump(root / "other-target", other, pattern_samples(4, seed=4),
                                                 target_name=str(tiny_target("llama", seed=1))))
    with pytest.raises(WiringMismatch, match="target fingerprint"):
        evaluate(str(trained["draft"]), other_target, device="cpu")
    with pytest.raises(SpecwireError, match="'val' split holds no samples"):
        evaluate(str(trained["draft"]), trained["dump"], target=tiny_llama_target, split="val", max_samples=0)


def test_eval_takes_a_train_out_folder(trained, tmp_path, capsys):
    """`--draft runs/x` (what `train --out` wrote) resolves to runs/x/draft and says so on stderr."""
    from specwire.cli import main
    from specwire.training.rundir import resolve_draft_arg

    run = trained["draft"].parent
    rc = main(["eval", "--draft", str(run), "--data", str(trained["dump"]), "--json", "--ttt-steps", "2", "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 0 and f"using {trained['draft']}" in captured.err
    assert len(json.loads(captured.out)["step_accuracy"]) == 2
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoint").mkdir(parents=True)
    (unfinished / "checkpoint" / "state.json").write_text("{}")
    with pytest.raises(SpecwireError, match="has not finished"):
        resolve_draft_arg(unfinished)
    assert main(["eval", "--draft", str(tmp_path), "--data", str(trained["dump"])]) == 2
    assert "expected a draft folder" in capsys.readouterr().err

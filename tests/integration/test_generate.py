"""`specwire generate` and `specwire demo` end to end: the streamed text is the decoded text, and speculative
decoding prints exactly what plain greedy decoding prints.

Fast tests use the tiny target (with a random tiny draft); the `slow` ones the built-in target and the
shipped draft.
"""

from __future__ import annotations

import re

import pytest

from specwire.decode.engine import SpecConfig
from specwire.decode.generate import GenerateConfig, decode_reply, generate_reply
from specwire.decode.sampling import SamplingParams
from specwire.errors import SpecwireError

from helpers import random_tiny_draft


def _run(capsys, *argv: str) -> tuple[str, str]:
    from specwire.cli import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr()


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama_target, tmp_path_factory):
    return random_tiny_draft(tiny_llama_target, tmp_path_factory.mktemp("draft") / "d")


def test_the_streamed_pieces_are_the_decoded_text(tiny_llama_target):
    pieces: list[str] = []
    ids = tiny_llama_target.encode_chat("hi")
    reply = decode_reply(tiny_llama_target, None, ids, max_new_tokens=24, on_text=pieces.append)
    assert "".join(pieces) == reply.text == tiny_llama_target.tokenizer.decode(reply.result.output_ids, skip_special_tokens=True)


@pytest.mark.parametrize("mode", ["--tree", "--chain"])
def test_generate_with_a_draft_prints_what_plain_greedy_prints(tiny_llama_target, tiny_draft, capsys, mode):
    common = ["generate", "--target", str(tiny_llama_target.info.path), "--prompt", "Write a haiku about the sea.",
              "--max-new-tokens", "20", "--device", "cpu"]
    plain_out, plain_err = _run(capsys, *common)
    spec_out, spec_err = _run(capsys, *common, "--draft", str(tiny_draft), mode, "--num-steps", "3", "--topk", "2",
                              "--num-draft-tokens", "6")
    assert spec_out == plain_out and plain_out.endswith("\n")
    assert "accept length" in spec_err and "accept length" not in plain_err and "tokens" in plain_err


def test_generate_reply_library_call(tiny_llama_target, tiny_draft):
    cfg = GenerateConfig(prompt="hello", target=str(tiny_llama_target.info.path), draft=str(tiny_draft), max_new_tokens=8,
                         spec=SpecConfig(budget="fixed", tree=False))
    spec = generate_reply(cfg, target=tiny_llama_target)
    plain = generate_reply(GenerateConfig(prompt="hello", max_new_tokens=8), target=tiny_llama_target)
    assert spec.result.output_ids == plain.result.output_ids and spec.text == plain.text
    assert spec.result.extra.get("tree") is False
    with pytest.raises(SpecwireError, match="temperature"):
        GenerateConfig(prompt="x", sampling=SamplingParams(temperature=-1))


def test_bad_speculation_flags_are_one_line_errors(tiny_llama_target, capsys):
    from specwire.cli import main

    assert main(["generate", "--target", str(tiny_llama_target.info.path), "--prompt", "hi", "--topk", "0"]) == 2
    err = capsys.readouterr().err
    assert "SpecConfig.topk" in err and "--topk 4" in err and err.count("\n") == 1


# ---- the built-in target and the shipped draft --------------------------------------------------------

def _shipped_draft_or_skip() -> str:
    from specwire.draft.checkpoint import shipped_draft_dir
    from specwire.draft.model import SHIPPED_DRAFT

    if not (shipped_draft_dir() / "config.json").is_file():
        pytest.skip("the shipped draft is not installed")
    return SHIPPED_DRAFT


@pytest.mark.slow
def test_generate_tree_with_the_shipped_draft_prints_plain_greedy_text(capsys):
    draft = _shipped_draft_or_skip()
    common = ["generate", "--prompt", "Explain in a few sentences why the sky is blue.", "--max-new-tokens", "48",
              "--device", "cpu"]
    plain_out, _ = _run(capsys, *common)
    spec_out, spec_err = _run(capsys, *common, "--draft", draft, "--tree")
    assert spec_out == plain_out and len(plain_out.strip()) > 20
    assert re.search(r"accept length \d+\.\d\d", spec_err), spec_err


@pytest.mark.slow
def test_demo_on_the_builtin_target_prints_a_speedup_line_and_the_doctor_verdict(capsys, tmp_path):
    _shipped_draft_or_skip()
    out, _ = _run(capsys, "demo", "--device", "cpu", "--max-new-tokens", "8", "--bench-prompts", "1",
                  "--bench-tokens", "16", "--out", str(tmp_path / "demo"))
    assert "default EAGLE-3 wiring" in out and "tree speculation" in out
    assert re.search(r"best: eagle3-(chain|tree) at [\d.]+ tok/s = [\d.]+x hf-generate and [\d.]+x plain", out), out
    assert "output identical to greedy" in out
    assert re.search(r"^doctor: ", out, re.M), out
    assert (tmp_path / "demo" / "results.json").is_file()

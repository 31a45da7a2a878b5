"""launch-cmd: the argv each engine gets, the pure SGLang flag rules, and every refusal with its fix."""

from __future__ import annotations

import json
import shlex

import pytest

from specwire.errors import SpecwireError
from specwire.interop.convert import export_draft
from specwire.interop.launch import check_sglang_flags, launch_command, sglang_max_draft_tokens

from helpers import make_native, read_cfg, write_cfg


@pytest.fixture()
def target(tiny_target) -> str:
    return str(tiny_target("llama"))


@pytest.fixture()
def exports(tmp_path, tiny_llama_target):
    nat = make_native(tmp_path, tiny_llama_target)
    export_draft(nat, tmp_path / "sg", fmt="sglang")
    export_draft(nat, tmp_path / "sp", fmt="speculators")
    return {"native": nat, "sg": tmp_path / "sg", "sp": tmp_path / "sp"}


# ---- pure flag rules --------------------------------------------------------------------------------

def test_sglang_tree_bound():
    assert sglang_max_draft_tokens(5, 1) == 6  # a chain: num_steps + 1
    assert sglang_max_draft_tokens(5, 4) == 1 + 4 + 4 * 16
    assert sglang_max_draft_tokens(1, 8) == 9
    assert sglang_max_draft_tokens(2, 2) == 7


def test_check_sglang_flags_accepts_and_refuses():
    assert check_sglang_flags(5, 4, 16) and check_sglang_flags(3, 1, 4) and check_sglang_flags(2, 2, 7)
    with pytest.raises(SpecwireError, match="silently overrides.*num-steps \\+ 1 = 6") as e:
        check_sglang_flags(5, 1, 16)
    assert "--num-draft-tokens 6" in str(e.value)
    with pytest.raises(SpecwireError, match="more than a tree of 2 steps with topk 2 can hold.*= 7"):
        check_sglang_flags(2, 2, 8)
    with pytest.raises(SpecwireError, match="positive integer"):
        check_sglang_flags(0, 4, 8)


# ---- accepted commands --------------------------------------------------------------------------------

def test_sglang_command(exports, target):
    r = launch_command(str(exports["sg"]), engine="sglang", target=target, port=30000)
    assert r.argv == ["python", "-m", "sglang.launch_server", "--model-path", target, "--speculative-algorithm", "EAGLE3",
                      "--speculative-draft-model-path", str(exports["sg"]), "--speculative-num-steps", "5",
                      "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16", "--tp-size", "1",
                      "--port", "30000"]
    assert shlex.split(r.command) == r.argv
    assert any("layer ids" in c and "[2, 4, 5]" in c for c in r.checks)
    assert any("max_position_embeddings" in c for c in r.checks)


def test_sglang_topk_one_defaults_to_a_chain(exports, target):
    r = launch_command(str(exports["sg"]), engine="sglang", target=target, num_steps=3, topk=1)
    assert r.argv[r.argv.index("--speculative-num-draft-tokens") + 1] == "4"


def test_vllm_command(exports, target):
    r = launch_command(str(exports["sp"]), engine="vllm", target=target, num_steps=3, tp=2)
    assert r.argv[:3] == ["vllm", "serve", target]
    spec = json.loads(r.argv[r.argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(exports["sp"]), "num_speculative_tokens": 3}
    assert r.argv[-2:] == ["--tensor-parallel-size", "2"]
    assert shlex.split(r.command) == r.argv
    assert launch_command(str(exports["native"]), engine="vllm", target=target).argv[0] == "vllm"


def test_cli_json(exports, target, capsys):
    from specwire.cli import main

    assert main(["launch-cmd", str(exports["sg"]), "--engine", "sglang", "--target", target, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "sglang" and isinstance(out["argv"], list) and shlex.split(out["command"]) == out["argv"]
    assert out["checks"]
    assert main(["launch-cmd", str(exports["native"]), "--engine", "sglang", "--target", target]) == 2
    assert "specwire export" in capsys.readouterr().err


# ---- refusals ---------------------------------------------------------------------------------------------

def test_native_layout_for_sglang_is_refused(exports, target):
    with pytest.raises(SpecwireError, match="silently skips.*export it: specwire export .* --format sglang --out DIR"):
        launch_command(str(exports["native"]), engine="sglang", target=target)


def test_sglang_layout_for_vllm_is_refused(exports, target):
    with pytest.raises(SpecwireError, match="--format speculators"):
        launch_command(str(exports["sg"]), engine="vllm", target=target)


def test_topk_one_override_is_refused(exports, target):
    with pytest.raises(SpecwireError, match="silently overrides"):
        launch_command(str(exports["sg"]), engine="sglang", target=target, num_steps=5, topk=1, num_draft_tokens=8)


def test_tree_too_small_is_refused(exports, target):
    with pytest.raises(SpecwireError, match="can hold"):
        launch_command(str(exports["sg"]), engine="sglang", target=target, num_steps=2, topk=2, num_draft_tokens=8)


def test_edited_layer_ids_are_refused(exports, target):
    cfg = read_cfg(exports["sg"])
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]  # someone "fixed" them to hs indices
    write_cfg(exports["sg"], cfg)
    with pytest.raises(SpecwireError, match=r"would feed the draft hs \[3, 5, 6\].*trained on hs \[2, 4, 5\]"):
        launch_command(str(exports["sg"]), engine="sglang", target=target)


def test_sglang_version_mismatch_is_refused(tmp_path, tiny_llama_target, target):
    nat = make_native(tmp_path, tiny_llama_target, hs_ids=(3, 5, 6))
    export_draft(nat, tmp_path / "sg", fmt="sglang")  # classic ids [2, 4, 5]
    launch_command(str(tmp_path / "sg"), engine="sglang", target=target)
    with pytest.raises(SpecwireError, match=r"hs \[2, 4, 5\].*--sglang-version shift-if-one"):
        launch_command(str(tmp_path / "sg"), engine="sglang", target=target, sglang_version="shift-if-one")


def test_missing_norm_before_residual_is_refused_for_vllm(exports, target):
    cfg = read_cfg(exports["sp"])
    del cfg["norm_before_residual"]
    write_cfg(exports["sp"], cfg)
    with pytest.raises(SpecwireError, match="norm_before_residual=True; it was trained with False"):
        launch_command(str(exports["sp"]), engine="vllm", target=target)


def test_embedding_id_is_refused_for_sglang(tmp_path, tiny_llama_target, target):
    nat = make_native(tmp_path, tiny_llama_target, hs_ids=(0, 4, 5))
    r = export_draft(nat, tmp_path / "sg", fmt="sglang")
    assert r.layer_ids == [-1, 3, 4] and r.warnings
    with pytest.raises(SpecwireError, match="id -1"):
        launch_command(str(tmp_path / "sg"), engine="sglang", target=target)
    launch_command(str(nat), engine="vllm", target=target)


def test_short_max_position_embeddings_is_refused(exports, tiny_target, tmp_path):
    long_target = str(tiny_target("llama", max_position_embeddings=512))
    with pytest.raises(SpecwireError, match="max_position_embeddings 256 is smaller than the target's 512.*--max-position-embeddings 512"):
        launch_command(str(exports["sg"]), engine="sglang", target=long_target)
    export_draft(exports["native"], tmp_path / "sg512", fmt="sglang", max_position_embeddings=512)
    launch_command(str(tmp_path / "sg512"), engine="sglang", target=long_target)


@pytest.mark.parametrize("override, pattern", [
    ({"vocab_size": 300}, "vocab_size 260; .* has 300"),
    ({"hidden_size": 32}, "hidden_size 64; .* has 32"),
    ({"num_hidden_layers": 10}, "num_layers 8; .* has 10"),
])
def test_target_mismatch_is_refused(exports, tiny_target, override, pattern):
    other = str(tiny_target("llama", **override))
    with pytest.raises(SpecwireError, match=pattern):
        launch_command(str(exports["sp"]), engine="vllm", target=other)


def test_tree_flags_for_vllm_and_bad_tp_are_refused(exports, target):
    with pytest.raises(SpecwireError, match="SGLang tree flags"):
        launch_command(str(exports["sp"]), engine="vllm", target=target, topk=4)
    with pytest.raises(SpecwireError, match="--tp 3"):
        launch_command(str(exports["sg"]), engine="sglang", target=target, tp=3)


def test_draft_without_wiring_is_refused(exports, target):
    cfg = read_cfg(exports["sp"])
    del cfg["specwire"]
    write_cfg(exports["sp"], cfg)
    with pytest.raises(SpecwireError, match="specwire import"):
        launch_command(str(exports["sp"]), engine="vllm", target=target)


@pytest.mark.slow
def test_builtin_target_name(tmp_path):
    """--target smollm2-135m: a draft with SmolLM2's geometry (random weights, config-only checks)."""
    import torch

    from specwire.draft.checkpoint import save_draft
    from specwire.draft.model import DraftConfig, Eagle3Draft
    from specwire.target.load import read_target_config, resolve_target_path, target_info
    from specwire.wiring import TargetSpec, Wiring, default_hs_ids

    info = target_info("smollm2-135m")
    spec = TargetSpec(architecture=info.architecture, num_layers=info.num_layers, hidden_size=info.hidden_size,
                      vocab_size=info.vocab_size)
    cfg = DraftConfig.for_target(read_target_config(resolve_target_path("smollm2-135m")),
                                 Wiring(hs_ids=default_hs_ids(info.num_layers), target=spec), draft_vocab_size=1024)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[:1024] = True
    draft.set_vocab_map(torch.zeros(1024, dtype=torch.long), t2d)
    save_draft(draft, tmp_path / "native")
    export_draft(tmp_path / "native", tmp_path / "sg", fmt="sglang")
    r = launch_command(str(tmp_path / "sg"), engine="sglang", target="smollm2-135m")
    assert read_cfg(tmp_path / "sg")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert r.argv[r.argv.index("--model-path") + 1] == str(resolve_target_path("smollm2-135m"))
    assert launch_command(str(tmp_path / "native"), engine="vllm", target="smollm2-135m").argv[0] == "vllm"


def test_four_fused_states_are_refused_for_both_engines(tmp_path, tiny_llama_target, target):
    nat = make_native(tmp_path, tiny_llama_target, hs_ids=(1, 2, 4, 5))
    r = export_draft(nat, tmp_path / "sp", fmt="speculators")
    assert any("exactly 3" in w for w in r.warnings)
    with pytest.raises(SpecwireError, match="fuses 4 target states.*exactly 3"):
        launch_command(str(tmp_path / "sp"), engine="vllm", target=target)

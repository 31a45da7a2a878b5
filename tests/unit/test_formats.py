"""Checkpoint formats: key remaps on hand-made state dicts, lossless round trips, detection, and every
bad-input refusal (truncated files, huge headers, missing/extra tensors, wrong shapes, dtypes and
config field types). Tiny random drafts on the tiny Llama target; no engine needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specwire.draft.checkpoint import load_draft
from specwire.draft.model import DraftConfig, Eagle3Draft
from specwire.errors import SpecwireError, WiringMismatch
from specwire.interop.convert import export_draft, import_draft, native_shapes
from specwire.draft.reader import (
    FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS, detect_format, layer_layout, read_checkpoint,
)
from specwire.interop.engines import engine_reading
from specwire.interop.sglang import native_to_sglang_key, remap_keys, sglang_to_native_key
from specwire.wiring import SGLANG_VERSIONS, hs_to_sglang_ids, sglang_readings, sglang_to_hs

from helpers import DRAFT_VOCAB, make_native, read_cfg, tiny_wiring, write_cfg


# ---- helpers of this file ----------------------------------------------------------------------------

def assert_bitwise_equal(a: Path, b: Path) -> None:
    ta, tb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype, k
        assert torch.equal(ta[k], tb[k]), k


def native_config(path: Path) -> DraftConfig:
    return DraftConfig.from_dict(read_cfg(path)["specwire"]["draft_config"])


@pytest.fixture()
def native(tmp_path, tiny_llama_target) -> Path:
    return make_native(tmp_path, tiny_llama_target)


# ---- key remaps on hand-made state dicts -------------------------------------------------------------

def _hand_made(prefix: str) -> dict[str, torch.Tensor]:
    names = ["input_layernorm.weight", "hidden_norm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
             "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    sd = {prefix + n: torch.full((2,), float(i)) for i, n in enumerate(names)}
    sd.update({"fc.weight": torch.ones(2, 6), "norm.weight": torch.ones(2), "lm_head.weight": torch.ones(3, 2),
               "d2t": torch.zeros(3, dtype=torch.long), "t2d": torch.ones(3, dtype=torch.bool)})
    return sd


def test_native_to_sglang_remap_on_hand_made_state_dict():
    sd = _hand_made("layers.0.")
    out = remap_keys(sd, to=FORMAT_SGLANG)
    assert sorted(out) == sorted(_hand_made("midlayer."))
    assert out["midlayer.self_attn.q_proj.weight"] is sd["layers.0.self_attn.q_proj.weight"]  # values untouched
    for k in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"):
        assert out[k] is sd[k]


def test_sglang_to_native_remap_is_the_inverse():
    sd = _hand_made("midlayer.")
    back = remap_keys(remap_keys(sd, to=FORMAT_NATIVE), to=FORMAT_SGLANG)
    assert sorted(back) == sorted(sd) and all(back[k] is sd[k] for k in sd)
    assert sglang_to_native_key("midlayer.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert native_to_sglang_key("layers.0.hidden_norm.weight") == "midlayer.hidden_norm.weight"
    assert native_to_sglang_key("fc.weight") == "fc.weight" and sglang_to_native_key("d2t") == "d2t"


@pytest.mark.parametrize("name, to", [("layers.1.mlp.up_proj.weight", FORMAT_SGLANG),
                                      ("midlayer.mlp.up_proj.weight", FORMAT_SGLANG),
                                      ("layers.0.mlp.up_proj.weight", FORMAT_NATIVE)])
def test_remap_refuses_names_it_cannot_map(name, to):
    with pytest.raises(SpecwireError, match="layer|layout"):
        remap_keys({name: torch.zeros(1)}, to=to)


def test_layer_layout_names_each_layout():
    assert layer_layout(_hand_made("layers.0.")) == "layers"
    assert layer_layout(_hand_made("midlayer.")) == "midlayer"
    assert layer_layout({**_hand_made("midlayer."), "layers.0.x": 1}) == "mixed"
    assert layer_layout({"fc.weight": 1}) == "none"


@pytest.mark.parametrize("bias", [False, True])
def test_native_shapes_match_the_module(tiny_llama_target, bias):
    cfg = DraftConfig.for_target(tiny_llama_target.model.config, tiny_wiring(tiny_llama_target), draft_vocab_size=DRAFT_VOCAB)
    cfg.attention_bias = bias
    assert native_shapes(cfg) == Eagle3Draft(cfg).expected_shapes()


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_hs_to_sglang_ids_reads_back_on_that_version(version):
    L = 8
    for a in range(0, L + 1):
        for b in range(0, L + 1):
            hs = [a, b, L]
            if len(set(hs)) < 3:
                continue
            if version == "shift-if-one" and a == 1:
                with pytest.raises(SpecwireError, match="cannot be written"):
                    hs_to_sglang_ids(hs, L, sglang_version=version)
                continue
            assert sglang_to_hs(hs_to_sglang_ids(hs, L, sglang_version=version), L, sglang_version=version) == hs


def test_sglang_readings_show_the_version_ambiguity():
    assert sglang_readings([1, 3, 4], 8) == {"classic": [2, 4, 5], "shift-if-one": [2, 4, 5]}
    assert sglang_readings([2, 4, 5], 8) == {"classic": [3, 5, 6], "shift-if-one": [2, 4, 5]}
    assert sglang_readings([-1, 3, 4], 8) == {"classic": [0, 4, 5], "shift-if-one": None}


# ---- exports: config contents ------------------------------------------------------------------------

def test_sglang_export_config_and_keys(native, tmp_path, tiny_llama_target):
    r = export_draft(native, tmp_path / "sg", fmt="sglang")
    cfg = read_cfg(tmp_path / "sg")
    dc = native_config(native)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert r.layer_ids == [1, 3, 4] and list(r.wiring.hs_ids) == [2, 4, 5]
    assert cfg["vocab_size"] == 260 and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["rope_theta"] == dc.rope_parameters["rope_theta"] and cfg["rope_scaling"] is None
    assert "target_hidden_size" not in cfg  # written only when it differs from hidden_size
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "max_position_embeddings"):
        assert cfg[k] == getattr(dc, k), k
    assert cfg["specwire"]["sglang_version"] == "classic"
    names = load_file(str(tmp_path / "sg" / "model.safetensors")).keys()
    assert layer_layout(names) == "midlayer" and {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(names)
    # transformers reads it as a Llama config with the same rope and the extra fields kept
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(tmp_path / "sg")
    assert hf.rope_parameters["rope_theta"] == dc.rope_parameters["rope_theta"] and hf.draft_vocab_size == DRAFT_VOCAB
    assert hf.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_speculators_export_config(native, tmp_path):
    r = export_draft(native, tmp_path / "sp", fmt="speculators", verifier="org/target", num_speculative_tokens=3)
    cfg = read_cfg(tmp_path / "sp")
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["norm_before_residual"] is False and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["target_hidden_size"] == 64 and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    sc = cfg["speculators_config"]
    assert sc["verifier"]["name_or_path"] == "org/target" and sc["proposal_methods"][0]["speculative_tokens"] == 3
    assert r.layer_ids == [2, 4, 5]
    assert detect_format(tmp_path / "sp") == FORMAT_NATIVE  # it is a native checkpoint with the peer fields filled in
    load_draft(tmp_path / "sp")


def test_shift_if_one_export_writes_ids_that_version_reads_back(tmp_path, tiny_llama_target):
    nat = make_native(tmp_path, tiny_llama_target, hs_ids=(3, 5, 6))
    export_draft(nat, tmp_path / "classic", fmt="sglang")
    export_draft(nat, tmp_path / "new", fmt="sglang", sglang_version="shift-if-one")
    assert read_cfg(tmp_path / "classic")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert read_cfg(tmp_path / "new")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    r = import_draft(tmp_path / "new", tmp_path / "back")
    assert r.wiring == native_config(nat).wiring


# ---- lossless round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_round_trip_is_bitwise_with_the_same_wiring(tmp_path, tiny_llama_target, fmt, dtype):
    nat = make_native(tmp_path, tiny_llama_target, dtype=dtype)
    export_draft(nat, tmp_path / "out", fmt=fmt)
    r = import_draft(tmp_path / "out", tmp_path / "back")
    assert_bitwise_equal(nat, tmp_path / "back")
    assert native_config(tmp_path / "back") == native_config(nat)
    assert r.wiring == native_config(nat).wiring
    assert r.source_format == (FORMAT_SGLANG if fmt == "sglang" else FORMAT_NATIVE)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_round_trip_without_specwire_block_needs_the_target(tmp_path, tiny_llama_target, tiny_target, fmt):
    """A checkpoint from another tool (no specwire block) imports with --target to the same wiring."""
    nat = make_native(tmp_path, tiny_llama_target)
    export_draft(nat, tmp_path / "out", fmt=fmt)
    cfg = read_cfg(tmp_path / "out")
    del cfg["specwire"]
    write_cfg(tmp_path / "out", cfg)
    assert detect_format(tmp_path / "out") == fmt
    with pytest.raises(SpecwireError, match="--target"):
        import_draft(tmp_path / "out", tmp_path / "back")
    r = import_draft(tmp_path / "out", tmp_path / "back", target=str(tiny_target("llama")))
    assert_bitwise_equal(nat, tmp_path / "back")
    assert r.wiring == native_config(nat).wiring
    assert native_config(tmp_path / "back").wiring == native_config(nat).wiring


def test_ambiguous_sglang_ids_ask_for_the_version(tmp_path, tiny_llama_target, tiny_target):
    nat = make_native(tmp_path, tiny_llama_target, hs_ids=(3, 5, 6))
    export_draft(nat, tmp_path / "sg", fmt="sglang")  # classic ids [2, 4, 5]
    cfg = read_cfg(tmp_path / "sg")
    del cfg["specwire"]
    write_cfg(tmp_path / "sg", cfg)
    target = str(tiny_target("llama"))
    with pytest.raises(SpecwireError, match=r"--sglang-version") as e:
        import_draft(tmp_path / "sg", tmp_path / "back", target=target)
    assert "hs [3, 5, 6]" in str(e.value) and "hs [2, 4, 5]" in str(e.value) and "config.json" in str(e.value)
    r = import_draft(tmp_path / "sg", tmp_path / "back", target=target, sglang_version="classic")
    assert r.wiring == native_config(nat).wiring
    r = import_draft(tmp_path / "sg", tmp_path / "other", target=target, sglang_version="shift-if-one")
    assert r.wiring.hs_ids == (2, 4, 5)  # the other reading, as declared


def test_speculators_without_norm_before_residual_asks(tmp_path, tiny_llama_target, tiny_target):
    nat = make_native(tmp_path, tiny_llama_target, norm_before_residual=True)
    export_draft(nat, tmp_path / "sp", fmt="speculators")
    cfg = read_cfg(tmp_path / "sp")
    del cfg["specwire"], cfg["norm_before_residual"]
    write_cfg(tmp_path / "sp", cfg)
    target = str(tiny_target("llama"))
    with pytest.raises(SpecwireError, match="norm_before_residual.*vLLM assumes true") as e:
        import_draft(tmp_path / "sp", tmp_path / "back", target=target)
    assert "--norm-before-residual" in str(e.value)
    r = import_draft(tmp_path / "sp", tmp_path / "back", target=target, norm_before_residual="true")
    assert r.wiring == native_config(nat).wiring
    assert_bitwise_equal(nat, tmp_path / "back")


def test_embeddings_are_dropped_only_when_they_are_the_targets(tmp_path, tiny_llama_target, tiny_target):
    target = str(tiny_target("llama"))
    nat = make_native(tmp_path, tiny_llama_target)
    export_draft(nat, tmp_path / "sp", fmt="speculators", embeddings_from=target)
    assert "embed_tokens.weight" in load_file(str(tmp_path / "sp" / "model.safetensors"))
    r = import_draft(tmp_path / "sp", tmp_path / "back", target=target)
    assert any("embed_tokens.weight dropped" in n for n in r.notes)
    assert_bitwise_equal(nat, tmp_path / "back")
    t = load_file(str(tmp_path / "sp" / "model.safetensors"))
    t["embed_tokens.weight"] = t["embed_tokens.weight"] + 1
    save_file(t, str(tmp_path / "sp" / "model.safetensors"))
    with pytest.raises(SpecwireError, match="embed_tokens.weight' differs"):
        import_draft(tmp_path / "sp", tmp_path / "back2", target=target)


def test_shared_vocabulary_without_vocab_map_gets_identity(tmp_path, tiny_llama_target, tiny_target):
    nat = make_native(tmp_path, tiny_llama_target, draft_vocab=260)
    export_draft(nat, tmp_path / "sp", fmt="speculators")
    cfg = read_cfg(tmp_path / "sp")
    del cfg["specwire"]
    write_cfg(tmp_path / "sp", cfg)
    t = load_file(str(tmp_path / "sp" / "model.safetensors"))
    del t["d2t"], t["t2d"]
    save_file(t, str(tmp_path / "sp" / "model.safetensors"))
    r = import_draft(tmp_path / "sp", tmp_path / "back", target=str(tiny_target("llama")))
    assert any("identity map" in n for n in r.notes)
    d = load_draft(tmp_path / "back")
    assert torch.equal(d.d2t, torch.zeros(260, dtype=torch.long)) and bool(d.t2d.all())


def test_import_refuses_a_block_that_disagrees_with_the_config(native, tmp_path, tiny_target):
    export_draft(native, tmp_path / "sg", fmt="sglang")
    cfg = read_cfg(tmp_path / "sg")
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5]
    write_cfg(tmp_path / "sg", cfg)
    with pytest.raises(WiringMismatch, match="edited after export"):
        import_draft(tmp_path / "sg", tmp_path / "back")


def test_import_with_block_checks_the_target(native, tmp_path, tiny_target):
    export_draft(native, tmp_path / "sg", fmt="sglang")
    with pytest.raises(WiringMismatch, match="fingerprint"):
        import_draft(tmp_path / "sg", tmp_path / "back", target=str(tiny_target("llama", seed=1)))


# ---- detection and engine readings ------------------------------------------------------------------------

def test_detect_each_format(native, tmp_path):
    export_draft(native, tmp_path / "sg", fmt="sglang")
    assert detect_format(native) == FORMAT_NATIVE and detect_format(tmp_path / "sg") == FORMAT_SGLANG
    cfg = read_cfg(native)
    del cfg["specwire"]
    write_cfg(native, cfg)
    assert detect_format(native) == FORMAT_SPECULATORS


def test_sglang_config_with_native_names_is_flagged(native, tmp_path):
    """The seeds' failure: layers.0.* under an SGLang config loads silently with a random layer."""
    export_draft(native, tmp_path / "sg", fmt="sglang")
    t = load_file(str(native / "model.safetensors"))
    save_file(t, str(tmp_path / "sg" / "model.safetensors"))
    info = read_checkpoint(tmp_path / "sg")
    assert any("silently skips" in p for p in info.problems)
    assert engine_reading(info, "sglang", 8).layer_weights_loaded is False


def test_mixed_layout_is_not_guessed(native):
    t = load_file(str(native / "model.safetensors"))
    t["midlayer.hidden_norm.weight"] = t.pop("layers.0.hidden_norm.weight")
    save_file(t, str(native / "model.safetensors"))
    info = read_checkpoint(native)
    assert info.format is None and any("mix" in p for p in info.problems)
    with pytest.raises(SpecwireError, match="mix"):
        detect_format(native)


def test_engine_reading_applies_each_engines_rules(native, tmp_path):
    export_draft(native, tmp_path / "sg", fmt="sglang")
    sg = read_checkpoint(tmp_path / "sg")
    assert engine_reading(sg, "sglang", 8).hs_ids == (2, 4, 5)
    assert engine_reading(sg, "sglang", 8, sglang_version="shift-if-one").hs_ids == (2, 4, 5)
    cfg = read_cfg(native)
    del cfg["norm_before_residual"], cfg["eagle_aux_hidden_state_layer_ids"]
    write_cfg(native, cfg)
    r = engine_reading(read_checkpoint(native), "vllm", 8)
    assert r.norm_before_residual is True and r.hs_ids == (2, 4, 5) and "default" in r.ids_source


# ---- untrusted files stay data: every bad input is a clear SpecwireError ------------------------------------

@pytest.fixture()
def sg_export(native, tmp_path) -> Path:
    export_draft(native, tmp_path / "sg", fmt="sglang")
    return tmp_path / "sg"


def test_truncated_safetensors(sg_export, tmp_path):
    f = sg_export / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(SpecwireError, match=r"model\.safetensors.*truncated"):
        import_draft(sg_export, tmp_path / "back")
    f.write_bytes(b"\x01\x02")
    with pytest.raises(SpecwireError, match="truncated"):
        import_draft(sg_export, tmp_path / "back")


def test_lenient_reader_records_instead_of_raising(sg_export):
    """read_checkpoint (the doctor's entry point) never raises on bad files; it reports them."""
    f = sg_export / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    info = read_checkpoint(sg_export)
    assert info.read_errors and "truncated" in info.read_errors[0] and info.tensors == {}
    assert info.config is not None and info.specwire is not None and info.format == FORMAT_SGLANG  # from the config
    assert info.to_dict()["problems"] == info.problems


def test_header_claiming_huge_size(sg_export, tmp_path):
    (sg_export / "model.safetensors").write_bytes(struct.pack("<Q", 10**15) + b"{}")
    with pytest.raises(SpecwireError, match=r"model\.safetensors.*header claims"):
        import_draft(sg_export, tmp_path / "back")


def test_tensor_claiming_more_bytes_than_the_file(sg_export, tmp_path):
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": [1 << 20, 1 << 10], "data_offsets": [0, 1 << 32]}}).encode()
    (sg_export / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(SpecwireError, match="fc.weight"):
        import_draft(sg_export, tmp_path / "back")


@pytest.mark.parametrize("change, pattern", [
    (lambda t: t.pop("norm.weight"), r"missing tensors \['norm.weight'\]"),
    (lambda t: t.__setitem__("extra.weight", torch.zeros(2)), r"unexpected tensors \['extra.weight'\]"),
    (lambda t: t.__setitem__("fc.weight", torch.zeros(64, 10)), r"'fc.weight'.*(shape|inputs)"),
    (lambda t: t.__setitem__("midlayer.mlp.up_proj.weight", torch.zeros(3, 3)), r"'layers.0.mlp.up_proj.weight' has shape"),
    (lambda t: t.__setitem__("d2t", t["d2t"].float()), r"'d2t' has dtype torch.float32"),
    (lambda t: t.__setitem__("norm.weight", torch.ones(64, dtype=torch.int64)), r"'norm.weight' has dtype torch.int64"),
    (lambda t: t.__setitem__("t2d", torch.full((260,), 2.5)), r"'t2d' has dtype"),
])
def test_bad_tensors_name_the_file_and_tensor(sg_export, tmp_path, change, pattern):
    f = sg_export / "model.safetensors"
    t = load_file(str(f))
    change(t)
    save_file(t, str(f))
    with pytest.raises(SpecwireError, match=pattern) as e:
        import_draft(sg_export, tmp_path / "back")
    assert str(sg_export) in str(e.value)
    assert not (tmp_path / "back").exists()


def _strip_block(path: Path) -> dict:
    cfg = read_cfg(path)
    cfg.pop("specwire", None)
    return cfg


@pytest.mark.parametrize("field, value, pattern", [
    ("hidden_size", "64", r"field 'hidden_size' must be an integer, found '64' \(str\)"),
    ("eagle_config", [1, 3, 4], r"field 'eagle_config' must be a JSON object"),
    ("eagle_config", {"eagle_aux_hidden_state_layer_ids": ["1", 3, 4]}, r"eagle_config.eagle_aux_hidden_state_layer_ids' must be a list of integers"),
    ("rms_norm_eps", "1e-6", r"field 'rms_norm_eps' must be a number"),
    ("num_hidden_layers", 2, r"num_hidden_layers' is 2"),
    ("max_position_embeddings", None, r"field 'max_position_embeddings' must be an integer, found None"),
    ("draft_vocab_size", 100, r"draft_vocab_size' is 100 but lm_head.weight has 128 rows"),
    ("vocab_size", 300, r"vocab_size 300 differs from the target's 260"),
])
def test_bad_sglang_config_fields(sg_export, tmp_path, tiny_target, field, value, pattern):
    cfg = _strip_block(sg_export)
    cfg[field] = value
    write_cfg(sg_export, cfg)
    with pytest.raises(SpecwireError, match=pattern) as e:
        import_draft(sg_export, tmp_path / "back", target=str(tiny_target("llama")))
    assert "config.json" in str(e.value)


@pytest.mark.parametrize("edit, pattern", [
    (lambda c: c.__setitem__("transformer_layer_config", "llama"), r"'transformer_layer_config' must be a JSON object"),
    (lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 64.0), r"'transformer_layer_config.hidden_size' must be an integer"),
    (lambda c: c["transformer_layer_config"].__setitem__("model_type", "qwen3"), r"model_type' is 'qwen3'"),
    (lambda c: c.__setitem__("norm_before_residual", "false"), r"'norm_before_residual' must be true or false"),
    (lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4, 99]), r"out of range"),
    (lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [2, 4]), r"fc.weight takes 192 inputs"),
    (lambda c: c.__setitem__("fc_norm", True), r"'fc_norm' is true"),
])
def test_bad_speculators_config_fields(native, tmp_path, tiny_target, edit, pattern):
    cfg = _strip_block(native)
    edit(cfg)
    write_cfg(native, cfg)
    with pytest.raises(SpecwireError, match=pattern) as e:
        import_draft(native, tmp_path / "back", target=str(tiny_target("llama")))
    assert "config.json" in str(e.value)


def test_config_not_json_and_pickle_only_folders(tmp_path, native):
    (native / "config.json").write_text("{not json")
    with pytest.raises(SpecwireError, match=r"config\.json: not valid JSON"):
        import_draft(native, tmp_path / "back")
    pk = tmp_path / "pickled"
    pk.mkdir()
    (pk / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (pk / "pytorch_model.bin").write_bytes(b"\x80\x04this would be a pickle")
    with pytest.raises(SpecwireError, match="never unpickles"):
        import_draft(pk, tmp_path / "back")


def test_specwire_block_of_the_wrong_type(sg_export, tmp_path):
    cfg = read_cfg(sg_export)
    cfg["specwire"]["draft_config"]["hidden_size"] = "64"
    write_cfg(sg_export, cfg)
    with pytest.raises(SpecwireError, match=r"specwire.draft_config.*hidden_size"):
        import_draft(sg_export, tmp_path / "back")


# ---- export refusals --------------------------------------------------------------------------------------------

def test_export_needs_a_native_checkpoint(native, tmp_path):
    export_draft(native, tmp_path / "sg", fmt="sglang")
    with pytest.raises(SpecwireError, match="specwire import"):
        export_draft(tmp_path / "sg", tmp_path / "again", fmt="speculators")


def test_sglang_export_refuses_what_sglang_cannot_run(tmp_path, tiny_llama_target):
    nat = make_native(tmp_path, tiny_llama_target, norm_before_residual=True)
    with pytest.raises(SpecwireError, match="norm_before_residual"):
        export_draft(nat, tmp_path / "sg", fmt="sglang")
    four = make_native(tmp_path, tiny_llama_target, name="four", hs_ids=(1, 2, 4, 5))
    with pytest.raises(SpecwireError, match="fuses 4 target states"):
        export_draft(four, tmp_path / "sg", fmt="sglang")
    export_draft(four, tmp_path / "sp", fmt="speculators")  # vLLM path is fine
    assert not (tmp_path / "sg").exists()


def test_export_can_raise_max_position_embeddings(native, tmp_path):
    export_draft(native, tmp_path / "sp", fmt="speculators", max_position_embeddings=4096)
    assert native_config(tmp_path / "sp").max_position_embeddings == 4096
    assert read_cfg(tmp_path / "sp")["transformer_layer_config"]["max_position_embeddings"] == 4096


# ---- command line -----------------------------------------------------------------------------------------------

def test_cli_export_and_import_json(native, tmp_path, capsys):
    from specwire.cli import main

    assert main(["export", str(native), "--format", "sglang", "--out", str(tmp_path / "sg"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "sglang" and out["layer_ids"] == [1, 3, 4] and out["hs_ids"] == [2, 4, 5]
    assert main(["import", str(tmp_path / "sg"), "--out", str(tmp_path / "back"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source_format"] == "sglang" and out["hs_ids"] == [2, 4, 5]
    assert_bitwise_equal(native, tmp_path / "back")
    assert main(["import", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "error" in capsys.readouterr().err

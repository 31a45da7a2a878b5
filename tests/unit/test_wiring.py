"""The wiring contract: id conventions, defaults, validation, JSON round trip and comparison (no models)."""

from __future__ import annotations

import json

import pytest

from specwire.errors import SpecwireError, WiringMismatch
from specwire.wiring import (
    CONVENTIONS,
    SGLANG_VERSIONS,
    TargetSpec,
    Wiring,
    all_conventions,
    default_hs_ids,
    from_convention,
    hs_to_sglang,
    hs_to_specforge,
    hs_to_vllm,
    parse_ids,
    sglang_to_hs,
    specforge_to_hs,
    to_convention,
    validate_hs_ids,
    vllm_to_hs,
)

HS_LIKE = ("hs", "vllm", "speculators", "eagle")  # conventions where id k = hs k
SGLANG_LIKE = ("sglang", "specforge")  # id k = output of layer k = hs k+1


# ---- the worked examples of docs/CONVENTIONS.md section 1 ------------------------------------------

def test_smollm2_default_wiring_in_every_convention():
    L = 30
    assert default_hs_ids(L) == (2, 15, 27)
    conv = all_conventions(default_hs_ids(L), L)
    assert set(conv) == set(CONVENTIONS)
    for c in HS_LIKE:
        assert conv[c] == [2, 15, 27], c
    for c in SGLANG_LIKE:
        assert conv[c] == [1, 14, 26], c


def test_llama31_8b_sglang_vs_vllm():
    L = 32
    assert default_hs_ids(L) == (2, 16, 29)
    assert hs_to_sglang([2, 16, 29], L) == [1, 15, 28]
    assert hs_to_specforge([2, 16, 29], L) == [1, 15, 28]
    assert hs_to_vllm([2, 16, 29], L) == [2, 16, 29]
    assert sglang_to_hs([1, 15, 28], L) == [2, 16, 29]
    assert specforge_to_hs([1, 15, 28], L) == [2, 16, 29]
    assert vllm_to_hs([2, 16, 29], L) == [2, 16, 29]
    assert from_convention([1, 15, 28], L, "sglang") == from_convention([2, 16, 29], L, "vllm") == [2, 16, 29]


def test_sglang_embedding_id_is_minus_one():
    L = 30
    assert hs_to_sglang([0, 15, 27], L) == [-1, 14, 26]
    assert sglang_to_hs([-1, 14, 26], L) == [0, 15, 27]
    assert to_convention([0, 15, 30], L, "specforge") == [-1, 14, 29]
    assert to_convention([0, 15, 30], L, "vllm") == [0, 15, 30]


def test_sglang_last_layer_output_is_hs_L():
    L = 30
    assert hs_to_sglang([2, 15, 30], L) == [1, 14, 29]
    assert sglang_to_hs([1, 14, 29], L) == [2, 15, 30]
    with pytest.raises(SpecwireError, match="out of range"):
        sglang_to_hs([1, 14, 30], L)  # output of layer 30 does not exist in a 30-layer model


# ---- the two SGLang version rules -------------------------------------------------------------------

def test_sglang_versions_are_named():
    assert set(SGLANG_VERSIONS) == {"classic", "shift-if-one"}


def test_sglang_classic_always_shifts():
    assert sglang_to_hs([1, 14, 26], 30, sglang_version="classic") == [2, 15, 27]
    assert sglang_to_hs([2, 15, 27], 30, sglang_version="classic") == [3, 16, 28]


def test_sglang_shift_if_one_shifts_only_when_first_id_is_one():
    assert sglang_to_hs([1, 14, 26], 30, sglang_version="shift-if-one") == [2, 15, 27]
    # the same list, read by two versions, means two different wirings
    assert sglang_to_hs([2, 15, 27], 30, sglang_version="shift-if-one") == [2, 15, 27]
    assert sglang_to_hs([2, 15, 27], 30, sglang_version="classic") == [3, 16, 28]
    assert from_convention([2, 15, 27], 30, "sglang", sglang_version="shift-if-one") == [2, 15, 27]


def test_sglang_shift_if_one_cannot_read_the_embedding_id():
    # no shift applies (first id is -1), so -1 is read as an hs index and refused
    with pytest.raises(SpecwireError, match="out of range"):
        sglang_to_hs([-1, 14, 26], 30, sglang_version="shift-if-one")


def test_sglang_shift_pushing_past_last_layer_is_refused():
    # GPT-OSS-style crash: an id already at the last layer, shifted by +1, lands past L
    with pytest.raises(SpecwireError, match="out of range"):
        sglang_to_hs([1, 12, 24], 24, sglang_version="classic")


def test_unknown_sglang_version_and_convention():
    with pytest.raises(SpecwireError, match="unknown SGLang version"):
        sglang_to_hs([1, 2, 3], 30, sglang_version="v0.5")
    with pytest.raises(SpecwireError, match="unknown id convention"):
        to_convention([2, 15, 27], 30, "tensorrt")
    with pytest.raises(SpecwireError, match="unknown id convention"):
        from_convention([2, 15, 27], 30, "tensorrt")


# ---- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("L", [7, 8, 16, 30, 32, 61, 80])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_round_trip_every_convention(L, convention):
    for hs in (list(default_hs_ids(L)), [0, L // 2, L], [L, 0, 3], [1, 2, 3, 4]):
        ids = to_convention(hs, L, convention)
        assert from_convention(ids, L, convention) == hs
        if convention in SGLANG_LIKE:
            assert ids == [i - 1 for i in hs]
        else:
            assert ids == hs


@pytest.mark.parametrize("L", [8, 30, 32])
def test_round_trip_shift_if_one_holds_only_for_specforge_style_lists(L):
    hs = list(default_hs_ids(L))  # starts with hs 2 -> SGLang id 1 -> shifted by both versions
    assert sglang_to_hs(hs_to_sglang(hs, L), L, sglang_version="shift-if-one") == hs
    other = [3, L // 2, L - 3]  # SGLang [2, ...]: the newer version does not shift it back
    assert sglang_to_hs(hs_to_sglang(other, L), L, sglang_version="shift-if-one") == [2, L // 2 - 1, L - 4]


# ---- defaults -----------------------------------------------------------------------------------

@pytest.mark.parametrize("L,expected", [(7, (2, 3, 4)), (8, (2, 4, 5)), (24, (2, 12, 21)), (61, (2, 30, 58))])
def test_default_hs_ids(L, expected):
    assert default_hs_ids(L) == expected
    assert all_conventions(expected, L)["specforge"] == [1, L // 2 - 1, L - 4]


@pytest.mark.parametrize("L", [1, 3, 4, 5, 6])
def test_default_hs_ids_refuses_too_few_layers(L):
    with pytest.raises(SpecwireError):
        default_hs_ids(L)


# ---- validation ----------------------------------------------------------------------------------

def test_validate_accepts_the_full_range():
    validate_hs_ids([0, 15, 30], 30)
    validate_hs_ids([30, 0], 30)
    validate_hs_ids([2, 15, 27], 30, expected_count=3)


@pytest.mark.parametrize("ids", [[-1, 2, 3], [2, 15, 31], [100]])
def test_validate_out_of_range(ids):
    with pytest.raises(SpecwireError, match=r"out of range.*0\.\.30"):
        validate_hs_ids(ids, 30)


def test_validate_duplicates():
    with pytest.raises(SpecwireError, match="duplicates"):
        validate_hs_ids([2, 15, 15], 30)


def test_validate_wrong_count():
    with pytest.raises(SpecwireError, match="fuses 3 states"):
        validate_hs_ids([2, 15], 30, expected_count=3)


@pytest.mark.parametrize("bad", [[2.0, 15, 27], ["2", 15, 27], [True, 15, 27], [None]])
def test_validate_non_integers(bad):
    with pytest.raises(SpecwireError):
        validate_hs_ids(bad, 30)


def test_conversions_validate_their_input():
    with pytest.raises(SpecwireError, match="out of range"):
        hs_to_sglang([2, 15, 31], 30)
    with pytest.raises(SpecwireError, match="duplicates"):
        hs_to_vllm([2, 2, 27], 30)
    with pytest.raises(SpecwireError, match="out of range"):
        vllm_to_hs([2, 15, 31], 30)


def test_parse_ids():
    assert parse_ids("2,15,27") == [2, 15, 27]
    assert parse_ids("[2, 15, 27]") == [2, 15, 27]
    assert parse_ids(" -1,14,26 ") == [-1, 14, 26]
    with pytest.raises(SpecwireError, match="could not parse"):
        parse_ids("2,fifteen,27")


# ---- the Wiring record ----------------------------------------------------------------------------

def _spec(**kw) -> TargetSpec:
    base = dict(architecture="LlamaForCausalLM", num_layers=30, hidden_size=576, vocab_size=49152, fingerprint="abc123")
    return TargetSpec(**{**base, **kw})


def _wiring(**kw) -> Wiring:
    base = dict(hs_ids=(2, 15, 27), target=_spec(), draft_vocab_size=32000, tokenizer_fingerprint="tok1",
                chat_template_hash="tmpl1")
    return Wiring(**{**base, **kw})


def test_wiring_json_round_trip():
    w = _wiring(norm_before_residual=True)
    d = json.loads(json.dumps(w.to_dict()))
    assert d["hs_ids"] == [2, 15, 27]
    assert d["target"]["num_layers"] == 30
    assert d["pre_norm"] is True
    back = Wiring.from_dict(d)
    assert back == w
    assert back.differences(w) == []


def test_wiring_in_convention():
    w = _wiring()
    assert w.in_convention("sglang") == [1, 14, 26]
    assert w.in_convention("vllm") == [2, 15, 27]


def test_wiring_validates_ids_against_its_target():
    with pytest.raises(SpecwireError, match="Wiring.hs_ids"):
        _wiring(hs_ids=(2, 15, 31))
    with pytest.raises(SpecwireError, match="duplicates"):
        _wiring(hs_ids=(2, 2, 27))
    with pytest.raises(SpecwireError, match="pre_norm"):
        _wiring(pre_norm=False)


def test_target_spec_validates_sizes():
    with pytest.raises(SpecwireError, match="num_layers"):
        _spec(num_layers=0)
    with pytest.raises(SpecwireError, match="hidden_size"):
        _spec(hidden_size="576")


def test_differences_order_permutation_hint():
    diffs = _wiring().differences(_wiring(hs_ids=(27, 15, 2)))
    assert len(diffs) == 1
    assert "same layers, different order" in diffs[0]
    assert "hs [2, 15, 27]" in diffs[0] and "hs [27, 15, 2]" in diffs[0]


def test_differences_off_by_one_names_both_conventions():
    diffs = _wiring().differences(_wiring(hs_ids=(3, 16, 28)))
    assert len(diffs) == 1
    assert "different order" not in diffs[0]
    assert "SGLang [1, 14, 26]" in diffs[0] and "SGLang [2, 15, 27]" in diffs[0]


def test_differences_fingerprint():
    diffs = _wiring().differences(_wiring(target=_spec(fingerprint="zzz999")))
    assert diffs == ["target fingerprint: expected abc123, found zzz999 (weights of another model)"]
    # an unknown fingerprint on either side is not a difference
    assert _wiring().differences(_wiring(target=_spec(fingerprint=None))) == []
    assert _wiring().differences(_wiring(target=_spec(fingerprint="zzz999")), ignore=("fingerprint",)) == []


def test_differences_target_and_vocab_fields():
    other = _wiring(target=_spec(num_layers=32, hidden_size=4096), hs_ids=(2, 16, 29), draft_vocab_size=16000,
                    norm_before_residual=True)
    diffs = _wiring().differences(other)
    text = "\n".join(diffs)
    assert "target num_layers: expected 30, found 32" in text
    assert "target hidden_size: expected 576, found 4096" in text
    assert "draft_vocab_size: expected 32000, found 16000" in text
    assert "norm_before_residual: expected False, found True" in text
    assert "hidden-state ids" in text
    # unknown optional fields on one side are not differences
    assert _wiring().differences(_wiring(draft_vocab_size=None, tokenizer_fingerprint=None)) == []


def test_check_compatible_raises_wiring_mismatch():
    _wiring().check_compatible(_wiring(), expected_from="draft config", found_in="engine")
    with pytest.raises(WiringMismatch, match=r"draft config and dump manifest.*hidden-state ids.*Fix:") as e:
        _wiring().check_compatible(_wiring(hs_ids=(3, 16, 28)), expected_from="draft config", found_in="dump manifest")
    assert isinstance(e.value, SpecwireError)
    assert "\n" not in str(e.value)


def test_from_dict_unknown_field():
    d = _wiring().to_dict()
    d["layer_ids"] = [1, 2, 3]
    with pytest.raises(SpecwireError, match=r"manifest.json: unknown fields \['layer_ids'\]"):
        Wiring.from_dict(d, source="manifest.json")
    d = _wiring().to_dict()
    d["target"]["n_layers"] = 30
    with pytest.raises(SpecwireError, match=r"unknown fields \['n_layers'\]"):
        Wiring.from_dict(d)


@pytest.mark.parametrize("missing", ["hs_ids", "target"])
def test_from_dict_missing_field(missing):
    d = _wiring().to_dict()
    del d[missing]
    with pytest.raises(SpecwireError, match=missing):
        Wiring.from_dict(d, source="config.json")


@pytest.mark.parametrize("missing", ["num_layers", "hidden_size", "architecture"])
def test_from_dict_missing_target_field(missing):
    d = _wiring().to_dict()
    del d["target"][missing]
    with pytest.raises(SpecwireError, match=missing):
        Wiring.from_dict(d, source="config.json")


@pytest.mark.parametrize("bad", [None, [1, 2], "wiring"])
def test_from_dict_not_an_object(bad):
    with pytest.raises(SpecwireError):
        Wiring.from_dict(bad)


@pytest.mark.parametrize("hs", ["2,15,27", [2, "x", 27], [2.5, 15, 27], {"a": 1}])
def test_from_dict_bad_hs_ids(hs):
    d = _wiring().to_dict()
    d["hs_ids"] = hs
    with pytest.raises(SpecwireError, match="hs_ids"):
        Wiring.from_dict(d)


def test_from_dict_optional_fields_default():
    d = {"hs_ids": [2, 15, 27], "target": {"architecture": "LlamaForCausalLM", "num_layers": 30, "hidden_size": 576,
                                           "vocab_size": 49152}}
    w = Wiring.from_dict(d)
    assert w.pre_norm is True and w.norm_before_residual is False and w.draft_vocab_size is None
    assert w.target.fingerprint is None

"""The SGLang / SpecForge / SafeAILab-EAGLE checkpoint layout, both ways.

Owns: the key remaps (`layers.0.*` <-> `midlayer.*`), the config.json SGLang's `llama_eagle3` reads
(`sglang_config_json`, ids written for a given SGLang id rule through `wiring.hs_to_sglang_ids`), what
SGLang cannot run (`check_sglang_compatible`), and rebuilding a DraftConfig from an SGLang config that
has no specwire block (`config_from_sglang`: the ids are read under every SGLang rule and an
ambiguity is refused, never guessed). Does not read folders (`draft.reader`) or write them
(`interop.convert`).
"""

from __future__ import annotations

from typing import Any

from specwire.draft.checkpoint import specwire_block
from specwire.draft.model import DraftConfig
from specwire.errors import SpecwireError
from specwire.draft.fields import build_draft_config, get_field, layer_geometry
from specwire.draft.reader import (
    FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS, FORMATS, NATIVE_LAYER_PREFIX, SGLANG_ARCHITECTURE,
    SGLANG_LAYER_PREFIX, layer_index,
)
from specwire.wiring import DEFAULT_SGLANG_VERSION, default_hs_ids, hs_to_sglang_ids, sglang_readings

# SGLang's and SpecForge's LlamaForCausalLMEagle3 (and vLLM's Eagle3LlamaForCausalLM) build fc as
# Linear(3 * target_hidden_size, H).
SGLANG_NUM_FUSED = 3


# ---- key remaps (pure) ---------------------------------------------------------------------------

def native_to_sglang_key(name: str) -> str:
    """`layers.0.X` -> `midlayer.X`; fc, norm, lm_head, d2t, t2d keep their names."""
    if name.startswith(SGLANG_LAYER_PREFIX):
        raise SpecwireError(f"tensor '{name}' is already in SGLang's layout (midlayer.*), not the native one.")
    i = layer_index(name)
    if i is not None and i != 0:
        raise SpecwireError(f"tensor '{name}': SGLang's LlamaForCausalLMEagle3 holds one draft layer; layer {i} has no SGLang name.")
    return SGLANG_LAYER_PREFIX + name[len(NATIVE_LAYER_PREFIX):] if i == 0 else name


def sglang_to_native_key(name: str) -> str:
    """`midlayer.X` -> `layers.0.X`; the inverse of `native_to_sglang_key`."""
    if layer_index(name) is not None:
        raise SpecwireError(f"tensor '{name}' is already in the native layout (layers.N.*), not SGLang's midlayer.*.")
    return NATIVE_LAYER_PREFIX + name[len(SGLANG_LAYER_PREFIX):] if name.startswith(SGLANG_LAYER_PREFIX) else name


def remap_keys(tensors: dict[str, Any], *, to: str) -> dict[str, Any]:
    """Rename a state dict's keys to `to` ("sglang" or "native"); values are passed through untouched."""
    if to not in (FORMAT_SGLANG, FORMAT_NATIVE, FORMAT_SPECULATORS):
        raise SpecwireError(f"unknown key layout '{to}'; expected one of {list(FORMATS)}.")
    fn = native_to_sglang_key if to == FORMAT_SGLANG else sglang_to_native_key
    out = {fn(k): v for k, v in tensors.items()}
    if len(out) != len(tensors):
        raise SpecwireError(f"key remap to {to} made two tensors collide; the state dict mixes both layouts.")
    return out


# ---- export --------------------------------------------------------------------------------------

def _rope_for_sglang(rope: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) as SGLang/SpecForge configs write them (transformers 4 style)."""
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return float(rope["rope_theta"]), (None if scaling.get("rope_type", "default") == "default" else scaling)


def sglang_config_json(config: DraftConfig, *, sglang_version: str = DEFAULT_SGLANG_VERSION,
                       torch_dtype: str = "float32", extra: dict | None = None) -> dict[str, Any]:
    """config.json of the SGLang/SpecForge layout (a Llama config that SGLang's llama_eagle3 reads)."""
    w = config.wiring
    theta, scaling = _rope_for_sglang(config.rope_parameters)
    cfg: dict[str, Any] = {
        "architectures": [SGLANG_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "attention_bias": config.attention_bias,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": theta,  # SGLang and SpecForge (transformers 4 style) read these two ...
        "rope_scaling": scaling,
        "rope_parameters": dict(config.rope_parameters),  # ... transformers 5 reads this one
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "tie_word_embeddings": False,  # True would make SGLang use embed_tokens as lm_head
        "norm_before_residual": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": hs_to_sglang_ids(w.hs_ids, w.target.num_layers, sglang_version=sglang_version),
            "use_aux_hidden_state": True,
        },
        "torch_dtype": torch_dtype,
    }
    if config.target_hidden_size != config.hidden_size:
        cfg["target_hidden_size"] = config.target_hidden_size
    cfg["specwire"] = specwire_block(config, {**(extra or {}), "sglang_version": sglang_version})
    return cfg


def check_sglang_compatible(config: DraftConfig) -> list[str]:
    """Refuse drafts SGLang's LlamaForCausalLMEagle3 cannot run; return warnings for what it runs with a patch."""
    w = config.wiring
    if config.num_fused != SGLANG_NUM_FUSED:
        raise SpecwireError(
            f"the draft fuses {config.num_fused} target states; SGLang's and SpecForge's LlamaForCausalLMEagle3 build "
            f"fc for exactly {SGLANG_NUM_FUSED} (fc input = 3 x target hidden size).",
            fix="serve it with vLLM: specwire export D --format speculators --out DIR",
        )
    if config.norm_before_residual:
        raise SpecwireError(
            "the draft was trained with norm_before_residual=true; SGLang's draft layer always adds the un-normed "
            "residual, so it would run a different function.", fix="serve it with vLLM (specwire export D --format speculators --out DIR).",
        )
    if config.hidden_act != "silu" or config.attention_bias:
        raise SpecwireError(
            f"the draft layer uses hidden_act={config.hidden_act!r}, attention_bias={config.attention_bias}; SGLang's "
            "llama_eagle3 supports silu without attention bias only.")
    if 0 in w.hs_ids:
        return ["hs 0 (the embedding output, SGLang id -1) is in the wiring: stock SGLang cannot capture it "
                "(it needs a patched target model)."]
    return []


# ---- import (a config without a specwire block) --------------------------------------------------

def sglang_hs_ids(ids: list[int], num_layers: int, *, sglang_version: str | None, source: str, notes: list[str]) -> list[int]:
    """The hs ids SGLang ids mean: under `sglang_version`, or under every rule when they agree; refused otherwise."""
    readings = sglang_readings(ids, num_layers)
    if sglang_version is not None:
        hs = readings[sglang_version]
        if hs is None:
            raise SpecwireError(f"{source}: eagle_config ids {ids} are out of range for a {num_layers}-layer target "
                                f"when read by SGLang '{sglang_version}'.")
        notes.append(f"eagle_config ids {ids} read as hs {hs} (SGLang '{sglang_version}', as given).")
        return hs
    valid = {v: hs for v, hs in readings.items() if hs is not None}
    if not valid:
        raise SpecwireError(f"{source}: eagle_config ids {ids} are out of range for a {num_layers}-layer target under every SGLang version rule.")
    distinct = {tuple(hs) for hs in valid.values()}
    if len(distinct) == 1:
        hs = next(iter(valid.values()))
        why = "every SGLang version reads them the same way" if len(valid) == len(readings) else \
            f"only the '{next(iter(valid))}' reading is in range"
        notes.append(f"eagle_config ids {ids} read as hs {hs} ({why}).")
        return hs
    raise SpecwireError(
        f"{source}: field 'eagle_config.eagle_aux_hidden_state_layer_ids' = {ids} means hs {readings['classic']} on "
        f"classic SGLang (id k = output of layer k) but hs {readings['shift-if-one']} on newer SGLang (+1 only when "
        "the first id is 1); the checkpoint does not say which.",
        fix="pass --sglang-version classic or --sglang-version shift-if-one (the SGLang the draft was trained for).",
    )


def config_from_sglang(cfg: dict, shapes: dict[str, tuple[int, ...]], facts, *, source: str, sglang_version: str | None,
                       norm_before_residual: bool | None, notes: list[str]) -> DraftConfig:
    """DraftConfig of an SGLang-layout checkpoint without a specwire block, for the target in `facts`."""
    geo = layer_geometry(cfg, source=source, prefix="")
    L = facts.spec.num_layers
    ec = get_field(cfg, "eagle_config", "dict", source=source, default=None, nullable=True)
    if ec is None:
        hs = list(default_hs_ids(L))
        notes.append(f"no eagle_config: SGLang captures its default hs {hs}; recorded as the wiring.")
    else:
        if get_field(ec, "use_aux_hidden_state", "bool", source=source, prefix="eagle_config.", default=True) is not True:
            raise SpecwireError(f"{source}: field 'eagle_config.use_aux_hidden_state' is false; that is an EAGLE-1/2 draft, not EAGLE-3.")
        ids = get_field(ec, "eagle_aux_hidden_state_layer_ids", "int_list", source=source, prefix="eagle_config.", default=None, nullable=True)
        if ids is None:
            hs = list(default_hs_ids(L))
            notes.append(f"no eagle_config ids: SGLang captures its default hs {hs}; recorded as the wiring.")
        else:
            hs = sglang_hs_ids(ids, L, sglang_version=sglang_version, source=source, notes=notes)
    stated = get_field(cfg, "norm_before_residual", "bool", source=source, default=None, nullable=True)
    if norm_before_residual is not None and stated is not None and norm_before_residual != stated:
        raise SpecwireError(f"{source}: field 'norm_before_residual' is {stated} but --norm-before-residual says {norm_before_residual}.")
    nbr = stated if stated is not None else (norm_before_residual if norm_before_residual is not None else False)
    if nbr:
        notes.append("norm_before_residual=true: SGLang itself would ignore it (its layer adds the un-normed residual).")
    if get_field(cfg, "tie_word_embeddings", "bool", source=source, default=False):
        notes.append("tie_word_embeddings=true in the config: SGLang would use the embedding as lm_head; lm_head.weight imported as stored.")
    return build_draft_config(geo, cfg, shapes, facts.spec, hs=hs, nbr=nbr, source=source,
                              tokenizer_fingerprint=facts.tokenizer_fingerprint, chat_template_hash=facts.chat_template_hash)

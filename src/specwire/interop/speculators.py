"""The speculators (vLLM) checkpoint layout: the config a speculators export carries, and import from one.

Owns: filling a native config.json's speculators fields for export (`speculators_config_json`: verifier,
speculative tokens, the warnings for what vLLM or the speculators package cannot load) and rebuilding a
DraftConfig from a speculators config that has no specwire block (`config_from_speculators`: a field
whose meaning differs between tools, such as a missing `norm_before_residual`, is asked for, never
guessed). The key layout is the native one (`layers.0.*`). Does not read folders (`draft.reader`)
or write them (`interop.convert`).
"""

from __future__ import annotations

from specwire.draft.checkpoint import native_config_json
from specwire.draft.model import DraftConfig
from specwire.errors import SpecwireError
from specwire.draft.fields import build_draft_config, get_field, layer_geometry
from specwire.interop.sglang import SGLANG_NUM_FUSED
from specwire.wiring import default_hs_ids, validate_hs_ids

# vLLM's Eagle3LlamaForCausalLM builds fc for exactly this many fused states (as SGLang does).
VLLM_NUM_FUSED = SGLANG_NUM_FUSED


def speculators_config_json(config: DraftConfig, raw: dict, *, extra: dict, verifier: str | None,
                            num_speculative_tokens: int | None) -> tuple[dict, list[str]]:
    """(config.json of a speculators export, warnings): the native config with the peer fields filled in."""
    cfg = native_config_json(config, extra=extra)
    verifier_cfg = cfg["speculators_config"]["verifier"]
    old = raw.get("speculators_config") if isinstance(raw.get("speculators_config"), dict) else {}
    old_verifier = old.get("verifier") if isinstance(old.get("verifier"), dict) else {}
    verifier_cfg["name_or_path"] = verifier if verifier is not None else old_verifier.get("name_or_path")
    if num_speculative_tokens is not None:
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens <= 0:
            raise SpecwireError(f"--num-speculative-tokens must be a positive integer, found {num_speculative_tokens!r}.")
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = num_speculative_tokens
    warnings = []
    if config.num_fused != VLLM_NUM_FUSED:
        warnings.append(f"the draft fuses {config.num_fused} states: the speculators package loads it, but vLLM's "
                        f"Eagle3LlamaForCausalLM builds fc for exactly {VLLM_NUM_FUSED}.")
    if config.target_hidden_size != config.hidden_size:
        warnings.append("target_hidden_size differs from hidden_size: vLLM reads it, but the speculators 0.9 "
                        "Eagle3DraftModel builds fc from the draft width and cannot load this checkpoint.")
    return cfg, warnings


def config_from_speculators(cfg: dict, shapes: dict[str, tuple[int, ...]], facts, *, source: str,
                            norm_before_residual: bool | None, notes: list[str]) -> DraftConfig:
    """DraftConfig of a speculators checkpoint without a specwire block, for the target in `facts`."""
    stype = get_field(cfg, "speculators_model_type", "str", source=source)
    if stype != "eagle3":
        raise SpecwireError(f"{source}: field 'speculators_model_type' is {stype!r}; only 'eagle3' checkpoints are EAGLE-3 drafts.")
    lc = get_field(cfg, "transformer_layer_config", "dict", source=source)
    mt = lc.get("model_type", "llama")
    if mt != "llama":
        raise SpecwireError(f"{source}: field 'transformer_layer_config.model_type' is {mt!r}; specwire drafts are Llama layers "
                            "(a qwen3 draft layer has q/k norms that this draft does not).")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if get_field(cfg, flag, "bool", source=source, default=False):
            raise SpecwireError(f"{source}: field '{flag}' is true; specwire drafts do not implement that variant.")
    geo = layer_geometry(lc, source=source, prefix="transformer_layer_config.")
    ids = get_field(cfg, "eagle_aux_hidden_state_layer_ids", "int_list", source=source, default=None, nullable=True)
    if ids is None:
        hs = list(default_hs_ids(facts.spec.num_layers))
        notes.append(f"no eagle_aux_hidden_state_layer_ids: vLLM and speculators use their default hs {hs}; recorded as the wiring.")
    else:
        hs = list(ids)
        validate_hs_ids(hs, facts.spec.num_layers, what=f"{source}: eagle_aux_hidden_state_layer_ids")
    stated = get_field(cfg, "norm_before_residual", "bool", source=source, default=None, nullable=True)
    if stated is None:
        if norm_before_residual is None:
            raise SpecwireError(
                f"{source}: field 'norm_before_residual' is missing. vLLM assumes true when it is missing, the speculators "
                "package and SGLang use false; the checkpoint does not say which one it was trained with.",
                fix="pass --norm-before-residual true or --norm-before-residual false.",
            )
        stated = norm_before_residual
        notes.append(f"norm_before_residual missing; set to {stated} as given.")
    elif norm_before_residual is not None and norm_before_residual != stated:
        raise SpecwireError(f"{source}: field 'norm_before_residual' is {stated} but --norm-before-residual says {norm_before_residual}.")
    return build_draft_config(geo, cfg, shapes, facts.spec, hs=hs, nbr=stated, source=source,
                              tokenizer_fingerprint=facts.tokenizer_fingerprint, chat_template_hash=facts.chat_template_hash)

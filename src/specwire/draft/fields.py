"""Typed fields of a draft's config.json: the one parser of rope settings and layer geometry.

Owns: `get_field` (a field checked to be of a kind, with a SpecwireError naming the file and field),
`read_rope` (rope settings from a transformers 4 or 5 style config, the only rope parser), the lenient
`rope_or_none`, `layer_geometry` (DraftConfig geometry of a Llama-style layer config), the specwire
block's DraftConfig (`block_draft_config`) and a DraftConfig for a foreign checkpoint
(`build_draft_config`). Used by the reader (`draft.reader`), import and the doctor. Does not read
files or decide which config a tool reads.
"""

from __future__ import annotations

from typing import Any

from specwire.draft.model import NATIVE_FORMAT_VERSION, DraftConfig
from specwire.errors import SpecwireError
from specwire.wiring import TargetSpec, Wiring

# ---- typed config fields (strict: for import and for rebuilding a DraftConfig) -------------------

_KINDS = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
          "dict": "a JSON object", "list": "a list", "int_list": "a list of integers"}
_MISSING = object()


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(value: Any, kind: str) -> bool:
    checks = {
        "int": is_int,
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
        "int_list": lambda v: isinstance(v, list) and all(is_int(i) for i in v),
    }
    return checks[kind](value)


def get_field(cfg: dict, name: str, kind: str, *, source: str, prefix: str = "", default: Any = _MISSING,
              nullable: bool = False) -> Any:
    """cfg[name] checked to be of `kind`; a SpecwireError naming the file and field otherwise."""
    label = f"{prefix}{name}"
    if name not in cfg or (cfg[name] is None and not nullable and default is not _MISSING):
        if default is _MISSING:
            raise SpecwireError(f"{source}: field '{label}' is missing; expected {_KINDS[kind]}.")
        return default
    v = cfg[name]
    if v is None and nullable:
        return None
    if not _typed(v, kind):
        raise SpecwireError(f"{source}: field '{label}' must be {_KINDS[kind]}, found {v!r} ({type(v).__name__}).")
    if kind == "int" and v <= 0 and name not in ("pad_token_id",):
        raise SpecwireError(f"{source}: field '{label}' must be a positive integer, found {v}.")
    return v


def read_rope(cfg: dict, *, source: str, prefix: str = "") -> dict:
    """Rope settings as `rope_parameters` (transformers 5), from either style of config (the one parser)."""
    rp = get_field(cfg, "rope_parameters", "dict", source=source, prefix=prefix, default=None, nullable=True)
    if rp is not None:
        if "sliding_attention" in rp or "full_attention" in rp:
            raise SpecwireError(f"{source}: field '{prefix}rope_parameters' is per layer type; a one-layer Llama draft needs one rope setting.")
        rope = {k: v for k, v in rp.items() if v is not None}
    else:
        theta = get_field(cfg, "rope_theta", "number", source=source, prefix=prefix, default=10000.0)
        scaling = get_field(cfg, "rope_scaling", "dict", source=source, prefix=prefix, default=None, nullable=True)
        rope = {k: v for k, v in (scaling or {}).items() if v is not None}
        rope.setdefault("rope_theta", theta)
    legacy = rope.pop("type", "default")  # transformers 4 configs sometimes name it "type"
    rope_type = rope.setdefault("rope_type", legacy)
    if not _typed(rope.get("rope_theta"), "number"):
        raise SpecwireError(f"{source}: field '{prefix}rope_theta' must be a number, found {rope.get('rope_theta')!r}.")
    rope["rope_theta"] = float(rope["rope_theta"])
    if not isinstance(rope_type, str):
        raise SpecwireError(f"{source}: field '{prefix}rope_scaling.rope_type' must be a string, found {rope_type!r}.")
    return rope


def rope_or_none(cfg: dict) -> dict | None:
    """`read_rope` for lenient readers: None when the config has no readable rope settings."""
    if not any(k in cfg for k in ("rope_parameters", "rope_theta", "rope_scaling")):
        return None
    try:
        return read_rope(cfg, source="config")
    except SpecwireError:
        return None


def layer_geometry(lc: dict, *, source: str, prefix: str) -> dict[str, Any]:
    """DraftConfig geometry fields from a Llama-style (layer) config dict."""
    H = get_field(lc, "hidden_size", "int", source=source, prefix=prefix)
    heads = get_field(lc, "num_attention_heads", "int", source=source, prefix=prefix)
    layers = get_field(lc, "num_hidden_layers", "int", source=source, prefix=prefix, default=1)
    if layers != 1:
        raise SpecwireError(f"{source}: field '{prefix}num_hidden_layers' is {layers}; specwire drafts have exactly one layer.")
    act = get_field(lc, "hidden_act", "str", source=source, prefix=prefix, default="silu")
    if act != "silu":
        raise SpecwireError(f"{source}: field '{prefix}hidden_act' is {act!r}; EAGLE-3 Llama draft layers use 'silu'.")
    return dict(
        hidden_size=H,
        intermediate_size=get_field(lc, "intermediate_size", "int", source=source, prefix=prefix),
        num_attention_heads=heads,
        num_key_value_heads=get_field(lc, "num_key_value_heads", "int", source=source, prefix=prefix, default=heads),
        head_dim=get_field(lc, "head_dim", "int", source=source, prefix=prefix, default=H // heads),
        vocab_size=get_field(lc, "vocab_size", "int", source=source, prefix=prefix),
        max_position_embeddings=get_field(lc, "max_position_embeddings", "int", source=source, prefix=prefix),
        rms_norm_eps=float(get_field(lc, "rms_norm_eps", "number", source=source, prefix=prefix, default=1e-6)),
        rope_parameters=read_rope(lc, source=source, prefix=prefix),
        attention_bias=get_field(lc, "attention_bias", "bool", source=source, prefix=prefix, default=False),
        hidden_act=act,
    )


def block_draft_config(block: dict, *, source: str) -> DraftConfig:
    """The DraftConfig stored in a `specwire` block; errors name the file and the field."""
    where = f"{source}: specwire.draft_config"
    if block.get("format_version") != NATIVE_FORMAT_VERSION:
        raise SpecwireError(f"{source}: field 'specwire.format_version' is {block.get('format_version')!r}, expected {NATIVE_FORMAT_VERSION}.")
    if not isinstance(block.get("draft_config"), dict):
        raise SpecwireError(f"{where}: must be a JSON object, found {type(block.get('draft_config')).__name__}.")
    try:
        return DraftConfig.from_dict(block["draft_config"], source=where)
    except SpecwireError as e:
        if where in str(e):
            raise
        raise SpecwireError(f"{where}: {e}") from None


def build_draft_config(geo: dict, cfg: dict, shapes: dict[str, tuple[int, ...]], spec: TargetSpec, *, hs: list[int],
                       nbr: bool, source: str, tokenizer_fingerprint: str | None = None,
                       chat_template_hash: str | None = None) -> DraftConfig:
    """A DraftConfig for a foreign checkpoint: its geometry, `hs`, `nbr`, and the target it is read for."""
    lm = shapes.get("lm_head.weight")
    dvs = get_field(cfg, "draft_vocab_size", "int", source=source, default=None, nullable=True)
    if dvs is None:
        dvs = geo["vocab_size"]
    if lm is not None and lm[0] != dvs:
        raise SpecwireError(f"{source}: field 'draft_vocab_size' is {dvs} but lm_head.weight has {lm[0]} rows.")
    ths = get_field(cfg, "target_hidden_size", "int", source=source, default=None, nullable=True) or geo["hidden_size"]
    if geo["vocab_size"] != spec.vocab_size:
        raise SpecwireError(f"{source}: vocab_size {geo['vocab_size']} differs from the target's {spec.vocab_size}; "
                            "this draft was trained for another target (or another tokenizer).")
    if ths != spec.hidden_size:
        raise SpecwireError(f"{source}: target hidden size {ths} differs from the target's {spec.hidden_size}.")
    fc = shapes.get("fc.weight")
    if fc is not None and fc[-1] != len(hs) * ths:
        raise SpecwireError(f"{source}: fc.weight takes {fc[-1]} inputs but {len(hs)} layer ids x target hidden size {ths} "
                            f"= {len(hs) * ths}; the layer ids do not fit the weights.")
    wiring = Wiring(hs_ids=tuple(hs), target=spec, norm_before_residual=nbr, draft_vocab_size=dvs,
                    tokenizer_fingerprint=tokenizer_fingerprint, chat_template_hash=chat_template_hash)
    return DraftConfig(wiring=wiring, draft_vocab_size=dvs, norm_before_residual=nbr, target_hidden_size=ths, **geo)

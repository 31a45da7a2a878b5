"""How each serving engine reads a draft: which hidden states it captures, which residual mode and weights it uses.

Owns: `ENGINES`, the tensor layouts each engine loads (`ENGINE_LAYOUTS`), the residual-mode default an
engine assumes when a config is silent, and `engine_reading`: what SGLang or vLLM would capture and run
for a checkpoint read by the one reader (`draft.reader`). True for the engine versions read
(`docs/CONVENTIONS.md` sections 1-3 and 5); when an engine changes, this is the module to update.
Does not read files (`draft.reader`) or judge the result (`doctor.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specwire.draft.fields import is_int
from specwire.draft.reader import AUX_IDS, EAGLE_CONFIG_IDS, CheckpointInfo
from specwire.errors import SpecwireError
from specwire.wiring import (
    DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS, default_hs_ids, hs_to_sglang, sglang_to_hs, vllm_to_hs,
)

ENGINES: tuple[str, ...] = ("sglang", "vllm")

# The tensor layouts each engine loads (SGLang silently skips names it does not know).
ENGINE_LAYOUTS: dict[str, tuple[str, ...]] = {"sglang": ("midlayer",), "vllm": ("layers", "midlayer")}


def engine_nbr_default(engine: str, cfg: dict) -> bool:
    """norm_before_residual an engine uses when the config does not say (vLLM: True for speculators configs)."""
    return engine == "vllm" and "speculators_model_type" in cfg


@dataclass(frozen=True)
class EngineReading:
    """How an engine would wire and run a checkpoint (for the versions read)."""

    engine: str  # "sglang" | "vllm"
    hs_ids: tuple[int, ...] | None  # hs indices the engine captures for this draft (None: cannot tell)
    ids_source: str  # where those ids come from
    norm_before_residual: bool  # what the engine's draft layer does
    layer_weights_loaded: bool  # False when the engine silently skips the layer's tensor names
    notes: tuple[str, ...] = ()
    sglang_version: str | None = None  # the SGLang id rule applied (None for vLLM)
    ids_as_written: tuple[int, ...] | None = None  # the ids in the engine's own convention
    nbr_written: bool | None = None  # norm_before_residual as written in the config the engine reads
    ids_problem: str | None = None  # why hs_ids is None


def engine_reading(info: CheckpointInfo, engine: str, num_layers: int, *, sglang_version: str | None = None,
                   hs_ids=None, config: dict | None = None, config_name: str | None = None) -> EngineReading:
    """What `engine` would capture and run for `info` on a `num_layers`-layer target.

    hs_ids: the ids the engine is given on its command line, in its convention (overrides the config);
    config: the config.json the engine will read, when it is not the draft's own.
    """
    if engine not in ENGINES:
        raise SpecwireError(f"unknown engine '{engine}'; expected one of {list(ENGINES)}.")
    version = (sglang_version or DEFAULT_SGLANG_VERSION) if engine == "sglang" else None
    if version is not None and version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{version}'; expected one of {list(SGLANG_VERSIONS)}.")
    cfg = config if config is not None else info.raw
    where = config_name or "the draft's config.json"
    L = num_layers
    nbr_written = cfg.get("norm_before_residual") if isinstance(cfg.get("norm_before_residual"), bool) else None
    notes: list[str] = []
    ec = cfg.get("eagle_config")
    ec_ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    aux = cfg.get(AUX_IDS)
    if hs_ids is not None:
        ids, src = list(hs_ids), f"--hs-ids (in {engine}'s convention)"
    elif engine == "sglang" and ec_ids is not None:
        ids, src = ec_ids, f"{EAGLE_CONFIG_IDS} in {where} read by SGLang '{version}'"
    elif engine == "vllm" and aux:
        ids, src = aux, f"{AUX_IDS} in {where} (hs indices)"
    elif engine == "vllm" and ec_ids is not None:
        ids, src = ec_ids, f"{EAGLE_CONFIG_IDS} in {where} (read by vLLM as hs indices, no +1)"
        notes.append("vLLM versions differ on reading eagle_config ids; export --format speculators to be explicit.")
    else:
        ids = None
        d = list(default_hs_ids(L))
        hs, written = tuple(d), tuple(hs_to_sglang(d, L) if engine == "sglang" else d)
        src = (f"SGLang default (no eagle_config ids in {where})" if engine == "sglang"
               else f"vLLM default (no layer ids in {where})")
    problem = None
    if ids is not None:
        written = tuple(ids) if isinstance(ids, list) else None
        try:
            if not isinstance(ids, list) or not all(is_int(i) for i in ids):
                raise SpecwireError(f"layer ids {ids!r} are not a list of integers")
            hs = tuple(sglang_to_hs(ids, L, sglang_version=version) if engine == "sglang" else vllm_to_hs(ids, L))
        except SpecwireError as e:
            hs, problem = None, str(e)
            src = f"{src}, unreadable"
    if engine == "sglang":
        if hs is not None and 0 in hs:
            notes.append("hs 0 (SGLang id -1, the embedding output) cannot be captured by stock SGLang.")
        if nbr_written is True:
            notes.append("config says norm_before_residual=true but SGLang's draft layer always adds the un-normed residual.")
        nbr = False
    else:
        nbr = nbr_written if nbr_written is not None else engine_nbr_default(engine, cfg)
        if nbr_written is None:
            notes.append(f"norm_before_residual missing: vLLM assumes {nbr} for this config style.")
        if "d2t" not in info.tensors and isinstance(cfg.get("draft_vocab_size"), int):
            notes.append("no d2t tensor: vLLM treats the draft vocabulary as the target's (shared vocab).")
    loaded = info.layout in ENGINE_LAYOUTS[engine]
    if engine == "sglang" and not loaded:
        notes.append("SGLang silently skips tensor names it does not know: the draft layer would stay randomly initialised.")
    return EngineReading(engine, hs, src, nbr, loaded, tuple(notes), version, written, nbr_written, problem)

"""The wiring contract: which target hidden states an EAGLE-3 draft reads, and how each tool names them.

Owns: the `Wiring` and `TargetSpec` records that travel with every dump, checkpoint and engine, their
JSON round trip, validation and comparison, each tool's default ids, and the *only* place where ids
are translated between conventions. Does not load models (see `targets`) or capture states
(see `capture`).

Our convention is the **hs index** (`docs/CONVENTIONS.md` section 1). For a target with L decoder layers:
  hs 0      = embedding output (input of decoder layer 0)
  hs i      = residual stream after decoder layer i-1 = input of layer i, 1 <= i <= L
  hs L      = output of the last layer, *before* the final norm.
Other tools:
  vLLM / speculators / original EAGLE: id k = hs k (identity).
  SGLang / SpecForge: id k = "output of layer k" = hs k+1; id -1 = embedding output = hs 0.
    SGLang versions disagree on when the +1 is applied (see `SGLANG_VERSIONS`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from dataclasses import dataclass
from typing import Any, Literal

from specwire.errors import SpecwireError, WiringMismatch

WIRING_FORMAT_VERSION = 1

Convention = Literal["hs", "sglang", "specforge", "vllm", "speculators", "eagle"]
CONVENTIONS: tuple[str, ...] = ("hs", "sglang", "vllm", "speculators", "specforge", "eagle")

# How SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` (true for the versions read):
#   "classic": every id k is "output of layer k", captured before layer k+1: hs = k + 1.
#   "shift-if-one": newer SGLang applies the +1 only when the first id is 1 (a SpecForge-style list);
#                   otherwise the ids are taken as hs indices. The same config can thus mean two wirings.
SGLANG_VERSIONS: tuple[str, ...] = ("classic", "shift-if-one")
DEFAULT_SGLANG_VERSION = "classic"


def default_hs_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default fused states, hs [2, L//2, L-3] (the same for every tool, once translated)."""
    L = num_layers
    if L < 4:
        raise SpecwireError(f"EAGLE-3 default wiring needs a target with at least 4 layers, found {L}.")
    ids = (2, L // 2, L - 3)
    if len(set(ids)) != 3:
        raise SpecwireError(f"EAGLE-3 default wiring {list(ids)} has duplicates for a {L}-layer target.")
    return ids


# ---- conversions: hs index <-> each tool's convention --------------------------------------------

def hs_to_sglang(hs_ids: tuple[int, ...] | list[int], num_layers: int) -> list[int]:
    """hs index -> SGLang/SpecForge layer-output id (hs 0 -> -1, hs k -> k-1)."""
    validate_hs_ids(hs_ids, num_layers)
    return [int(i) - 1 for i in hs_ids]


def sglang_to_hs(
    ids: tuple[int, ...] | list[int], num_layers: int, *, sglang_version: str = DEFAULT_SGLANG_VERSION
) -> list[int]:
    """SGLang layer-output ids -> hs indices, as the given SGLang version reads them."""
    if sglang_version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{sglang_version}'; expected one of {list(SGLANG_VERSIONS)}.")
    ids = [int(i) for i in ids]
    if sglang_version == "shift-if-one" and (not ids or ids[0] != 1):
        hs = ids
    else:
        hs = [i + 1 for i in ids]
    validate_hs_ids(hs, num_layers, what=f"SGLang ids {ids} (read as hs {hs})")
    return hs


def hs_to_specforge(hs_ids, num_layers: int) -> list[int]:
    """SpecForge uses SGLang's layer-output ids."""
    return hs_to_sglang(hs_ids, num_layers)


def specforge_to_hs(ids, num_layers: int) -> list[int]:
    return sglang_to_hs(ids, num_layers, sglang_version="classic")


def hs_to_vllm(hs_ids, num_layers: int) -> list[int]:
    """vLLM and speculators `eagle_aux_hidden_state_layer_ids` are hs indices."""
    validate_hs_ids(hs_ids, num_layers)
    return [int(i) for i in hs_ids]


def vllm_to_hs(ids, num_layers: int) -> list[int]:
    validate_hs_ids(ids, num_layers, what=f"vLLM ids {list(ids)}")
    return [int(i) for i in ids]


hs_to_speculators, speculators_to_hs = hs_to_vllm, vllm_to_hs
hs_to_eagle, eagle_to_hs = hs_to_vllm, vllm_to_hs

_TO = {"hs": hs_to_vllm, "vllm": hs_to_vllm, "speculators": hs_to_vllm, "eagle": hs_to_vllm,
       "sglang": hs_to_sglang, "specforge": hs_to_specforge}
_FROM = {"hs": vllm_to_hs, "vllm": vllm_to_hs, "speculators": vllm_to_hs, "eagle": vllm_to_hs,
         "specforge": specforge_to_hs}


def to_convention(hs_ids, num_layers: int, convention: str) -> list[int]:
    """hs indices -> ids in `convention`."""
    if convention not in _TO:
        raise SpecwireError(f"unknown id convention '{convention}'; expected one of {list(CONVENTIONS)}.")
    return _TO[convention](hs_ids, num_layers)


def from_convention(ids, num_layers: int, convention: str, *, sglang_version: str = DEFAULT_SGLANG_VERSION) -> list[int]:
    """Ids in `convention` -> hs indices."""
    if convention == "sglang":
        return sglang_to_hs(ids, num_layers, sglang_version=sglang_version)
    if convention not in _FROM:
        raise SpecwireError(f"unknown id convention '{convention}'; expected one of {list(CONVENTIONS)}.")
    return _FROM[convention](ids, num_layers)


def hs_to_sglang_ids(hs_ids, num_layers: int, *, sglang_version: str = DEFAULT_SGLANG_VERSION) -> list[int]:
    """The `eagle_config` ids that SGLang `sglang_version` reads back as exactly `hs_ids`.

    classic: id = hs - 1 (hs 0 -> -1). shift-if-one: the +1 applies only when the first id is 1, so
    hs lists starting at 2 are written classically, others as plain hs indices; a list starting at
    hs 1 cannot be expressed on that version.
    """
    if sglang_version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{sglang_version}'; expected one of {list(SGLANG_VERSIONS)}.")
    hs = [int(i) for i in hs_ids]
    validate_hs_ids(hs, num_layers)
    if sglang_version == "classic" or (hs and hs[0] == 2):
        ids = [i - 1 for i in hs]
    elif hs and hs[0] == 1:
        raise SpecwireError(
            f"hs ids {hs} cannot be written for SGLang '{sglang_version}': an id list starting with 1 is shifted "
            "(read as hs 2...), and any other first id is read unshifted, so hs 1 first is unreachable.",
            fix="reorder is not possible (fc weights are tied to the order); serve on a 'classic' SGLang or retrain with another wiring.",
        )
    else:
        ids = list(hs)
    assert sglang_to_hs(ids, num_layers, sglang_version=sglang_version) == hs
    return ids


def sglang_readings(ids, num_layers: int) -> dict[str, list[int] | None]:
    """How each SGLang version rule reads `ids` (None where that reading is out of range)."""
    out: dict[str, list[int] | None] = {}
    for v in SGLANG_VERSIONS:
        try:
            out[v] = sglang_to_hs(ids, num_layers, sglang_version=v)
        except SpecwireError:
            out[v] = None
    return out


def num_hs_indices(num_layers: int) -> int:
    """How many hs indices a target with `num_layers` decoder layers has: 0..L, so L + 1."""
    return int(num_layers) + 1


# The mix-ups between a trained and a served wiring that have names (see `classify_wiring`).
WIRING_MIXUPS: tuple[str, ...] = ("match", "permutation", "shift-plus-one", "shift-minus-one", "embedding-first",
                                  "embedding-dropped", "different")


def classify_wiring(trained, served, num_layers: int) -> str:
    """Name the mix-up between the trained and the served hs ids (one of `WIRING_MIXUPS`)."""
    t, s = [int(i) for i in trained], [int(i) for i in served]
    if t == s:
        return "match"
    if sorted(t) == sorted(s):
        return "permutation"
    if s == [i + 1 for i in t]:
        return "shift-plus-one"  # SGLang's +1 applied on ids that were already hs indices
    if s == [i - 1 for i in t]:
        return "shift-minus-one"  # the +1 not applied (SpecForge ids read as hs indices)
    if s and t and s[0] == 0 and s[1:] == t[:-1]:
        return "embedding-first"  # the incident: embeddings prepended, the last trained state dropped
    if s and t and t[0] == 0 and t[1:] == s[:-1]:
        return "embedding-dropped"  # trained with embeddings first, served without them
    return "different"


def all_conventions(hs_ids, num_layers: int) -> dict[str, list[int]]:
    """The same wiring in every tool's convention."""
    return {c: to_convention(hs_ids, num_layers, c) for c in CONVENTIONS}


def validate_hs_ids(hs_ids, num_layers: int, *, expected_count: int | None = None, what: str = "hs ids") -> None:
    """Refuse ids out of [0, L], duplicates, or the wrong count."""
    ids = list(hs_ids)
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= num_layers]
    if bad:
        raise SpecwireError(
            f"{what}: {bad} out of range; a {num_layers}-layer target has hs indices 0..{num_layers} "
            f"(0 = embeddings, {num_layers} = last layer output before the final norm)."
        )
    if len(set(ids)) != len(ids):
        raise SpecwireError(f"{what}: {ids} has duplicates; each fused state must be a different layer.")
    if expected_count is not None and len(ids) != expected_count:
        raise SpecwireError(
            f"{what}: {ids} has {len(ids)} ids but the draft's fc fuses {expected_count} states "
            f"(fc input width = {expected_count} x hidden size)."
        )


def parse_ids(text: str) -> list[int]:
    """Parse '2,15,27' or '[2, 15, 27]' into a list of ints."""
    cleaned = text.strip().strip("[]")
    try:
        return [int(t) for t in cleaned.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise SpecwireError(f"could not parse layer ids '{text}'; expected comma-separated integers like 2,15,27.") from None


# ---- the records ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetSpec:
    """Identity of a target model: enough to refuse pairing a draft with another model."""

    architecture: str  # e.g. "LlamaForCausalLM"
    num_layers: int  # L, decoder layers
    hidden_size: int  # H of the target
    vocab_size: int  # rows of the target's embedding / lm_head
    fingerprint: str | None = None  # hash of the embedding matrix and L (see targets.fingerprint)

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecwireError(f"TargetSpec.{name}: expected a positive integer, found {v!r}.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "wiring") -> "TargetSpec":
        return cls(**_pick(d, cls, source=f"{source}.target"))


@dataclass(frozen=True)
class Wiring:
    """The contract between a draft and the hidden states it is fed.

    Every dump manifest, checkpoint config and engine holds one; consumers compare and refuse a mismatch.
    """

    hs_ids: tuple[int, ...]  # fused states in hs-index convention, in fc concatenation order
    target: TargetSpec
    pre_norm: bool = True  # captured states are pre-final-norm residual streams (always true here)
    norm_before_residual: bool = False  # draft layer: residual is hidden_norm(h) (True) or raw h (False)
    draft_vocab_size: int | None = None  # rows of the draft lm_head; None until the vocab map is built
    tokenizer_fingerprint: str | None = None  # hash of the tokenizer's vocabulary
    chat_template_hash: str | None = None  # hash of the chat template used for training data
    version: int = WIRING_FORMAT_VERSION

    def __post_init__(self):
        try:  # ints and numpy/torch integers only: 2.5 or "2" must not be rounded or parsed silently
            ids = tuple(operator.index(i) for i in self.hs_ids)
        except TypeError:
            raise SpecwireError(f"Wiring.hs_ids: expected a list of integers, found {self.hs_ids!r}.") from None
        object.__setattr__(self, "hs_ids", ids)
        validate_hs_ids(self.hs_ids, self.target.num_layers, what="Wiring.hs_ids")
        if not self.pre_norm:
            raise SpecwireError("Wiring.pre_norm: only pre-final-norm captures are supported (found false).")

    # JSON round trip
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hs_ids"] = list(self.hs_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "wiring") -> "Wiring":
        if not isinstance(d, dict):
            raise SpecwireError(f"{source}: expected a JSON object for the wiring, found {type(d).__name__}.")
        fields = _pick(d, cls, source=source)
        if "target" not in fields or not isinstance(fields["target"], dict):
            raise SpecwireError(f"{source}: field 'target' missing or not an object.")
        if not isinstance(fields.get("hs_ids"), list):
            raise SpecwireError(f"{source}: field 'hs_ids' must be a list of integers, found {fields.get('hs_ids')!r}.")
        fields["target"] = TargetSpec.from_dict(fields["target"], source=source)
        return cls(**fields)

    def in_convention(self, convention: str) -> list[int]:
        return to_convention(self.hs_ids, self.target.num_layers, convention)

    def replace(self, **changes) -> "Wiring":
        return dataclasses.replace(self, **changes)

    def differences(self, other: "Wiring", *, ignore: tuple[str, ...] = ()) -> list[str]:
        """Human-readable list of what differs between self (expected) and other (found)."""
        out: list[str] = []
        L = self.target.num_layers

        def fmt_ids(ids):
            try:
                return f"hs {list(ids)} (SGLang {hs_to_sglang(ids, L)})"
            except SpecwireError:
                return f"hs {list(ids)}"

        if "hs_ids" not in ignore and self.hs_ids != other.hs_ids:
            hint = " (same layers, different order: fc weights are tied to the order)" if sorted(self.hs_ids) == sorted(other.hs_ids) else ""
            out.append(f"hidden-state ids: expected {fmt_ids(self.hs_ids)}, found {fmt_ids(other.hs_ids)}{hint}")
        for name in ("architecture", "num_layers", "hidden_size", "vocab_size"):
            a, b = getattr(self.target, name), getattr(other.target, name)
            if name not in ignore and a != b:
                out.append(f"target {name}: expected {a}, found {b}")
        fa, fb = self.target.fingerprint, other.target.fingerprint
        if "fingerprint" not in ignore and fa and fb and fa != fb:
            out.append(f"target fingerprint: expected {fa}, found {fb} (weights of another model)")
        for name in ("norm_before_residual", "draft_vocab_size", "tokenizer_fingerprint", "chat_template_hash"):
            a, b = getattr(self, name), getattr(other, name)
            if name not in ignore and a is not None and b is not None and a != b:
                out.append(f"{name}: expected {a}, found {b}")
        return out

    def check_compatible(self, other: "Wiring", *, expected_from: str, found_in: str, ignore: tuple[str, ...] = ()) -> None:
        """Raise WiringMismatch naming every difference, or return quietly."""
        diffs = self.differences(other, ignore=ignore)
        if diffs:
            raise WiringMismatch(
                f"wiring mismatch between {expected_from} and {found_in}: " + "; ".join(diffs) + ".",
                fix="regenerate the data / retrain the draft for this target and wiring, or pass the matching target.",
            )


def _pick(d: dict[str, Any], cls, *, source: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise SpecwireError(f"{source}: unknown fields {unknown}; expected some of {sorted(names)}.")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in d]
    if missing:
        raise SpecwireError(f"{source}: missing required fields {missing}; expected {required} (and optionally the rest of {sorted(names)}).")
    return {k: v for k, v in d.items() if k in names}


def short_hash(data: bytes | str, n: int = 16) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()[:n]

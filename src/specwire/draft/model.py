"""The EAGLE-3 draft model and its native checkpoint.

Owns: `DraftConfig` (geometry + the `Wiring` it was trained for), the `Eagle3Draft` module as SGLang's
`LlamaForCausalLMEagle3` and speculators' `Eagle3DraftModel` run it (`docs/CONVENTIONS.md` section 2), and the
native checkpoint's format markers. Does not own attention *patterns*: the caller passes an `attend` function
(causal for plain use, TTT masks in training, tree masks in decoding) so one module serves all three.

Forward, for positions t of one sequence (paper: Li et al., EAGLE-3, 2025):
  g_t   = fc(cat(target hs at hs_ids))                     # only when the input is n*H_target wide
  x_t   = cat(input_layernorm(embed(token_{t+1})), hidden_norm(h_t))   # embeddings first
  h'_t  = residual + o_proj(attn(x)) ; h'_t += mlp(post_attention_layernorm(h'_t))
        residual = h_t, or hidden_norm(h_t) when norm_before_residual
  logits over the draft vocab = lm_head(norm(h'_t)); h'_t (pre-norm) is fed to the next draft step.

The native checkpoint on disk (save, load, the shipped draft) is `draft.checkpoint`; this module keeps
only the format markers its `specwire` config block carries (`NATIVE_FORMAT`, `NATIVE_FORMAT_VERSION`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from specwire.errors import SpecwireError
from specwire.wiring import Wiring

SHIPPED_DRAFT = "smollm2-135m-eagle3"
NATIVE_FORMAT = "specwire-native"
NATIVE_FORMAT_VERSION = 1

# attend(q [B, nh, Tq, d], k [B, nkv, Tq, d], v [B, nkv, Tq, d]) -> [B, nh, Tq, d]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DraftConfig:
    """Geometry of a one-layer EAGLE-3 draft, plus the wiring it reads."""

    wiring: Wiring  # which target states fc fuses, and the target identity
    hidden_size: int  # H of the draft layer (usually the target's)
    intermediate_size: int  # MLP width
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # target vocabulary (embedding rows, t2d length)
    draft_vocab_size: int  # lm_head rows
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    attention_bias: bool = False
    hidden_act: str = "silu"
    norm_before_residual: bool = False  # see module docstring; always written explicitly
    target_hidden_size: int | None = None  # H of the target (fc input = n_fused * this)

    def __post_init__(self):
        if self.target_hidden_size is None:
            self.target_hidden_size = self.wiring.target.hidden_size
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "draft_vocab_size", "max_position_embeddings", "target_hidden_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecwireError(f"DraftConfig.{name}: expected a positive integer, found {v!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise SpecwireError(
                f"DraftConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})."
            )
        if self.draft_vocab_size > self.vocab_size:
            raise SpecwireError(f"DraftConfig: draft_vocab_size {self.draft_vocab_size} > target vocab {self.vocab_size}.")
        if self.wiring.norm_before_residual != self.norm_before_residual:
            raise SpecwireError("DraftConfig: norm_before_residual differs from the wiring's; they must agree.")
        if self.wiring.draft_vocab_size not in (None, self.draft_vocab_size):
            raise SpecwireError(
                f"DraftConfig: draft_vocab_size {self.draft_vocab_size} differs from the wiring's {self.wiring.draft_vocab_size}."
            )

    @property
    def num_fused(self) -> int:
        return len(self.wiring.hs_ids)

    @property
    def fc_in_features(self) -> int:
        return self.num_fused * self.target_hidden_size

    @classmethod
    def for_target(cls, target_config, wiring: Wiring, *, draft_vocab_size: int, norm_before_residual: bool = False,
                   intermediate_size: int | None = None) -> "DraftConfig":
        """A draft layer with the target's attention geometry (EAGLE practice)."""
        c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        H = wiring.target.hidden_size
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head")
        kv = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or H // heads
        rope = getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": float(getattr(c, "rope_theta", 10000.0))}
        rope = {k: v for k, v in dict(rope).items() if v is not None}
        maxpos = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", 2048)
        wiring = wiring.replace(norm_before_residual=norm_before_residual, draft_vocab_size=draft_vocab_size)
        return cls(
            wiring=wiring, hidden_size=H, intermediate_size=intermediate_size or getattr(c, "intermediate_size", None) or 4 * H,
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=wiring.target.vocab_size,
            draft_vocab_size=draft_vocab_size, max_position_embeddings=int(maxpos),
            rms_norm_eps=float(getattr(c, "rms_norm_eps", None) or getattr(c, "layer_norm_epsilon", 1e-6)),
            rope_parameters=rope, norm_before_residual=norm_before_residual,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["wiring"] = self.wiring.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "draft config") -> "DraftConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecwireError(f"{source}: unknown fields {unknown}.")
        d = dict(d)
        d["wiring"] = Wiring.from_dict(d.get("wiring"), source=f"{source}.wiring")
        try:
            return cls(**d)
        except TypeError as e:
            raise SpecwireError(f"{source}: {e}.") from None

    def llama_layer_config(self):
        """A one-layer transformers LlamaConfig with this geometry (for rope and for peers' loaders)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size, num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, vocab_size=self.vocab_size, max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_parameters=dict(self.rope_parameters), attention_bias=self.attention_bias,
            hidden_act=self.hidden_act, tie_word_embeddings=False,
        )


# ---- building blocks -----------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dim, computed in float32. [..., H] -> [..., H]"""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's fused op: in float32 bitwise the formula below (tests/unit/test_draft_step.py checks it),
        # one call instead of eight; a draft step runs four norms
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, n, T, d]; cos/sin: [B, T, d]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal self-attention over the Tq positions given (no cache)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def masked_attend(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """Attention with an explicit boolean mask (True = may attend). mask: [B or 1, 1, Tq, Tk]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, self.nh * self.d, bias=c.attention_bias)
        self.k_proj = nn.Linear(2 * c.hidden_size, self.nkv * self.d, bias=c.attention_bias)
        self.v_proj = nn.Linear(2 * c.hidden_size, self.nkv * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.d, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x: [B, T, 2H] -> q [B, nh, T, d], k/v [B, nkv, T, d] (rope applied to q, k)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """The EAGLE-3 decoder layer: q/k/v read cat([input_layernorm(embeds), hidden_norm(h)])."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = DraftMLP(c)

    def forward(self, embeds, h, cos, sin, attend: AttendFn):
        """embeds, h: [B, T, H] -> new h [B, T, H] (pre-norm)."""
        hn = self.hidden_norm(h)
        residual = hn if self.norm_before_residual else h
        x = torch.cat([self.input_layernorm(embeds), hn], dim=-1)  # shape: [B, T, 2H], embeddings first
        q, k, v = self.self_attn.qkv(x, cos, sin)
        a = attend(q, k, v)  # shape: [B, nh, T, d]
        B, _, T, _ = a.shape
        h = residual + self.self_attn.o_proj(a.transpose(1, 2).reshape(B, T, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class DraftOutput:
    logits: torch.Tensor  # [B, T, draft_vocab]
    hidden: torch.Tensor  # [B, T, H], pre-norm, fed back at the next draft step


class Eagle3Draft(nn.Module):
    """One-layer EAGLE-3 draft. Token embeddings are the target's (shared, frozen, not saved)."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = config
        self.acceptance = None  # draft.acceptance.DraftAcceptance from the draft folder (set by the engine's loader)
        self.served = None  # decode.draft_step.ServedStep: this layer's pass for decoding (set by the engine's loader)
        c = config
        self.fc = nn.Linear(c.fc_in_features, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([DraftLayer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # d2t[i]: offset, target id = i + d2t[i]; t2d[j]: target id j is in the draft vocab
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.t2d[: c.draft_vocab_size] = True
        self._embed: nn.Embedding | None = None  # attached from the target, not a submodule
        # rope frequencies stay fp32 whatever the weights' dtype (plain attribute, not a buffer)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        layer_cfg = c.llama_layer_config()
        rope_type = layer_cfg.rope_parameters.get("rope_type", "default")
        if rope_type == "default":
            base = float(layer_cfg.rope_parameters["rope_theta"])
            self._inv_freq = 1.0 / (base ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
            self._rope_scale = 1.0
        else:
            inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](layer_cfg, None)
            self._inv_freq, self._rope_scale = inv_freq.float(), float(scale)

    # -- embeddings ---------------------------------------------------------------------------------
    def attach_embeddings(self, embedding: nn.Module) -> "Eagle3Draft":
        """Share the target's token embedding (frozen). Its width must be the draft's H."""
        w = embedding.weight
        if tuple(w.shape) != (self.config.vocab_size, self.config.hidden_size):
            raise SpecwireError(
                f"target embedding has shape {tuple(w.shape)}, the draft expects "
                f"({self.config.vocab_size}, {self.config.hidden_size}) (vocab, hidden)."
            )
        object.__setattr__(self, "_embed", embedding)
        return self

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._embed is None:
            raise SpecwireError("the draft has no token embeddings: call attach_embeddings(target embedding) first.")
        with torch.no_grad():
            e = self._embed(input_ids)
        return e.to(self.fc.weight.dtype)

    # -- maths ----------------------------------------------------------------------------------------
    def fuse(self, target_states: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated target states. [B, T, n*H_t] -> [B, T, H]."""
        if target_states.shape[-1] != self.config.fc_in_features:
            raise SpecwireError(
                f"draft fc expects {self.config.num_fused} fused states of width {self.config.target_hidden_size} "
                f"({self.config.fc_in_features}), got width {target_states.shape[-1]}."
            )
        return self.fc(target_states.to(self.fc.weight.dtype))

    def rope(self, position_ids: torch.Tensor, like: torch.Tensor):
        """cos, sin for position_ids [B, T]: each [B, T, head_dim]."""
        inv = self._inv_freq.to(position_ids.device)
        freqs = position_ids.float()[..., None] * inv  # shape: [B, T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self._rope_scale).to(like.dtype), (emb.sin() * self._rope_scale).to(like.dtype)

    def step(self, hidden: torch.Tensor, attend: AttendFn = causal_attend, *, input_ids: torch.Tensor | None = None,
             embeds: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
             rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One draft step, the only place the decoder layer is run (forward, training's TTT unroll and the
        engine's proposer all call it). Returns the new hidden state (pre-norm), [B, T, H].

        hidden: [B, T, H], already fused (`fuse`) or the draft's own previous output. The next tokens come
        as `input_ids` [B, T] (target ids) or as precomputed `embeds` [B, T, H]; positions as
        `position_ids` [B, T] or as precomputed `rope` = (cos, sin), each [B, T, head_dim] (the unroll
        reuses one pair for every step). `attend` decides what each query sees.
        """
        if (input_ids is None) == (embeds is None):
            raise ValueError("Eagle3Draft.step: pass exactly one of input_ids and embeds")
        if (position_ids is None) == (rope is None):
            raise ValueError("Eagle3Draft.step: pass exactly one of position_ids and rope")
        e = self.embed(input_ids) if embeds is None else embeds  # shape: [B, T, H]
        cos, sin = self.rope(position_ids, hidden) if rope is None else rope
        return self.layers[0](e, hidden, cos, sin, attend)  # shape: [B, T, H]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits of step outputs: lm_head(norm(h)). [..., H] -> [..., draft_vocab]"""
        return self.lm_head(self.norm(hidden))

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attend: AttendFn = causal_attend,
        *,
        embeds: torch.Tensor | None = None,
    ) -> DraftOutput:
        """One draft step with logits everywhere. hidden: [B, T, H] (already fused, or the draft's own
        output); input_ids: [B, T] target ids of the *next* tokens; position_ids: [B, T]."""
        if embeds is None:
            h = self.step(hidden, attend, input_ids=input_ids, position_ids=position_ids)
        else:
            h = self.step(hidden, attend, embeds=embeds, position_ids=position_ids)
        return DraftOutput(logits=self.logits(h), hidden=h)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocab ids -> target vocab ids (d2t offsets)."""
        return draft_ids + self.d2t[draft_ids]

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        check_vocab_map(d2t, t2d, vocab_size=self.config.vocab_size, source="vocab map")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, *, vocab_size: int, source: str) -> None:
    """d2t offsets must map to distinct in-range target ids that are exactly the ones t2d marks."""
    target_ids = torch.arange(len(d2t), device=d2t.device) + d2t
    if len(t2d) != vocab_size:
        raise SpecwireError(f"{source}: t2d has {len(t2d)} entries, expected the target vocab size {vocab_size}.")
    if (target_ids < 0).any() or (target_ids >= vocab_size).any():
        raise SpecwireError(f"{source}: d2t maps draft ids outside the target vocabulary 0..{vocab_size - 1}.")
    if len(torch.unique(target_ids)) != len(target_ids):
        raise SpecwireError(f"{source}: d2t maps two draft ids to the same target id.")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[target_ids].all()):
        raise SpecwireError(
            f"{source}: t2d marks {int(t2d.sum())} target ids but d2t has {len(d2t)} entries, or they disagree."
        )

"""Shared test fixtures: tiny random targets of every supported architecture, built offline.

Owns: `make_tiny_target_dir` (a plain function other tests import: `from conftest import
make_tiny_target_dir`), the `tiny_target` factory fixture (arch, seed) -> saved HF folder, and the
session-scoped `tiny_llama_target` (a loaded `specwire.target.load.Target`). Every model is built from
a small local transformers config (no hub), float32, with a byte-level tokenizer and a ChatML-like
chat template, so `load_target(folder)` works end to end. Does not test anything itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest_plugins = ["strict_skips"]  # a skip outside the allow-list fails `make test`

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "deepseek_v3", "gpt2")

# Special tokens of the tiny tokenizer, after its 256 byte tokens (so the vocab is 260).
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>")
TINY_VOCAB = 256 + len(SPECIALS)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BOS_ID, EOS_ID, PAD_ID = 256, 258, 259  # <|endoftext|>, <|im_end|>, <pad>

# Shared sizes: hidden 64, 8 layers, 4 heads, vocab 260, 256 positions. 8 layers, not fewer: EAGLE-3's
# default wiring hs [2, L//2, L-3] has duplicates below 7 layers, and load_target reports it.
_COMMON = dict(vocab_size=TINY_VOCAB, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
               tie_word_embeddings=False)
_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.05)


def tiny_config(arch: str = "llama", **overrides):
    """A tiny transformers config of `arch` (one of ARCHS); `overrides` replace any field."""
    import transformers as tf

    if arch == "llama":
        cfg = tf.LlamaConfig(**{**_COMMON, **_LLAMA_LIKE, **overrides})
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**{**_COMMON, **_LLAMA_LIKE, "use_sliding_window": False, **overrides})
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**{**_COMMON, **_LLAMA_LIKE, "head_dim": 16, "use_sliding_window": False, **overrides})
    elif arch == "mistral":
        cfg = tf.MistralConfig(**{**_COMMON, **_LLAMA_LIKE, "sliding_window": None, **overrides})
    elif arch == "deepseek_v3":
        # MoE with multi-head latent attention; layer 0 dense (first_k_dense_replace=1), layers 1-7 MoE.
        base = dict(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
            q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
            max_position_embeddings=256, initializer_range=0.05,
        )
        cfg = tf.DeepseekV3Config(**{**_COMMON, **base, **overrides})
    elif arch == "gpt2":
        base = dict(n_embd=64, n_layer=8, n_head=4, n_positions=256, initializer_range=0.05)
        cfg = tf.GPT2Config(**{**_COMMON, **base, **overrides})
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; expected one of {ARCHS}")
    return cfg


def tiny_tokenizer():
    """A byte-level tokenizer (256 byte tokens, no merges) with SPECIALS and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for j, s in enumerate(SPECIALS):
        vocab[s] = 256 + j
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[2], pad_token=SPECIALS[3],
        chat_template=CHAT_TEMPLATE,
    )


def make_tiny_model(arch: str = "llama", *, seed: int = 0, **overrides):
    """A random tiny causal LM (eval mode, float32) of `arch`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=torch.float32)
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    return model.eval()


def make_tiny_target_dir(tmp_path, arch: str = "llama", *, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `arch` model plus the tiny tokenizer into tmp_path/<arch>-s<seed>; return it."""
    out = Path(tmp_path) / f"{arch}-s{seed}"
    if overrides:
        out = out.with_name(out.name + "-" + "-".join(f"{k}{v}" for k, v in sorted(overrides.items())))
    if (out / "config.json").is_file():
        return out
    model = make_tiny_model(arch, seed=seed, **overrides)
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


_DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """One torch thread for fast tests, torch's default for `slow` ones (the built-in target).

    Tiny models are all overhead: with 2+ threads on a shared, busy CPU, OpenMP's spinning makes a
    tiny forward pass 10-20x slower than with one thread. SPECWIRE_TEST_THREADS overrides both.
    """
    n = int(os.environ.get("SPECWIRE_TEST_THREADS", 0)) or (
        _DEFAULT_THREADS if request.node.get_closest_marker("slow") else 1)
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(_DEFAULT_THREADS)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Factory: tiny_target(arch, seed=0, **overrides) -> folder of a saved tiny model (cached per session)."""
    root = tmp_path_factory.mktemp("tiny-targets")

    def factory(arch: str = "llama", seed: int = 0, **overrides) -> Path:
        return make_tiny_target_dir(root, arch, seed=seed, **overrides)

    return factory


@pytest.fixture(scope="session")
def tiny_llama_target(tiny_target):
    """A loaded tiny Llama `Target` on CPU (shared: do not modify it)."""
    from specwire.target.load import load_target

    return load_target(tiny_target("llama"), device="cpu", dtype="float32")

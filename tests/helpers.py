"""Builders and helpers shared by more than one test file (test files never import each other).

Owns: the tiny offline targets (a byte-level tokenizer, tiny random models of every supported
architecture, saved HF folders), random tiny drafts (in memory, saved natively, or saved with the
engine's wiring), draft config.json I/O, pattern-task dumps and training configs, the engine's oracle
proposer, and a toy decode for the streaming-text rules. Plain functions and classes only: fixtures
live in conftest.py (which imports the tiny-target builders from here). Tests import with
`from helpers import ...` (tests/ is on sys.path because conftest.py lives there). Asserts nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specwire.data.dump import DUMP_FORMAT, DUMP_FORMAT_VERSION, MANIFEST, SHARD_FORMAT, VOCAB_COUNTS, shard_name
from specwire.decode.tree import DraftTree, chain_tree
from specwire.draft.checkpoint import save_draft
from specwire.draft.model import DraftConfig, Eagle3Draft
from specwire.safeio import save_tensors, write_json
from specwire.target.load import chat_template_hash, tokenizer_fingerprint
from specwire.training.batches import expected_wiring
from specwire.training.config import TrainConfig
from specwire.wiring import Wiring, default_hs_ids


# ---- tiny targets: built offline from a local transformers config (no hub), float32 --------------

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


def gguf_dequantized(w: torch.Tensor, form: str) -> torch.Tensor:
    """w [N, K] (K % 32 == 0) quantized as llama.cpp quantizes it (per block of 32: q4_1 stores d = (max - min) / 15
    and m = min as float16, codes 0..15; q8_0 stores d = max |x| / 127, int8 codes) and dequantized as gguf-py
    dequantizes it, in float32: what a model converted from a GGUF file holds."""
    N, K = w.shape
    x = w.detach().float().view(N, K // 32, 32)
    if form == "q4_1":
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d = (hi - lo) / 15
        inv = torch.where(d == 0, torch.zeros(()), 1 / d)
        q = torch.clamp(((x - lo) * inv + 0.5).floor(), 0, 15)
        d16, m16 = d.half().float(), lo.half().float()
        return (d16 * q + m16).view(N, K)  # two roundings, as numpy computes it
    d = x.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros(()), 1 / d)
    return (torch.round(x * inv) * d.half().float()).view(N, K)


def make_gguf_like_target_dir(tmp_path, arch: str = "llama", *, seed: int = 0) -> Path:
    """A tiny target whose weights are a GGUF file's, dequantized (`gguf_dequantized`): every linear layer of the
    decoder in q4_1, the lm_head in q8_0, as the built-in target is. Saved into tmp_path/<arch>-s<seed>-gguf."""
    out = Path(tmp_path) / f"{arch}-s{seed}-gguf"
    if (out / "config.json").is_file():
        return out
    model = make_tiny_model(arch, seed=seed)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(gguf_dequantized(m.weight, "q8_0" if name == "lm_head" else "q4_1"))
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


# ---- random tiny drafts, and a draft folder's config.json ---------------------------------------

DRAFT_VOCAB = 128


def tiny_wiring(target, hs_ids=None) -> Wiring:
    """The wiring a draft trained on `target` (a loaded specwire Target) would carry."""
    return Wiring(
        hs_ids=tuple(hs_ids or default_hs_ids(target.num_layers)), target=target.spec,
        tokenizer_fingerprint=tokenizer_fingerprint(target.tokenizer), chat_template_hash=chat_template_hash(target.tokenizer),
    )


def make_draft(target, *, hs_ids=None, draft_vocab: int = DRAFT_VOCAB, norm_before_residual: bool = False,
               seed: int = 0) -> Eagle3Draft:
    """A random tiny draft for `target` with a random valid vocab map and non-trivial norm weights."""
    cfg = DraftConfig.for_target(target.model.config, tiny_wiring(target, hs_ids), draft_vocab_size=draft_vocab,
                                 norm_before_residual=norm_before_residual)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    V = cfg.vocab_size
    ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values  # target ids kept, sorted
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(draft_vocab), t2d)
    return draft


def make_native(tmp_path: Path, target, name: str = "native", **kw) -> Path:
    """`make_draft(target, **kw)` saved natively as tmp_path/name (`dtype=` is save_draft's)."""
    dtype = kw.pop("dtype", None)
    return save_draft(make_draft(target, **kw), Path(tmp_path) / name, dtype=dtype)


def read_cfg(path: Path) -> dict:
    """A draft folder's config.json."""
    return json.loads((Path(path) / "config.json").read_text())


def write_cfg(path: Path, cfg: dict) -> None:
    (Path(path) / "config.json").write_text(json.dumps(cfg, indent=2))


def make_draft_dir(target, out, *, seed: int = 0, draft_vocab: int = 128, hs_ids=None):
    """A random but valid EAGLE-3 draft for `target` (random vocab subset as d2t/t2d), saved natively.

    Default hs ids: the embeddings, a middle layer and the last layer (pre-norm), so both hook kinds run."""
    torch.manual_seed(seed)
    L = target.num_layers
    hs_ids = hs_ids or (0, L // 2, L)
    w = Wiring(hs_ids=hs_ids, target=target.spec)
    draft = Eagle3Draft(DraftConfig.for_target(target.model.config, w, draft_vocab_size=draft_vocab))
    g = torch.Generator().manual_seed(seed)
    V = target.spec.vocab_size
    ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(draft_vocab), t2d)
    return save_draft(draft, out)


def random_tiny_draft(target, out: Path, *, seed: int = 0, draft_vocab_size: int = 200) -> Path:
    """A randomly initialised draft for `target`, saved as a native checkpoint (first ids = draft vocab)."""
    wiring = Wiring(hs_ids=default_hs_ids(target.num_layers), target=target.spec,
                    tokenizer_fingerprint=tokenizer_fingerprint(target.tokenizer),
                    chat_template_hash=chat_template_hash(target.tokenizer))
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig.for_target(target.model.config, wiring, draft_vocab_size=draft_vocab_size))
    return save_draft(draft, out)


# ---- dumps and training runs ---------------------------------------------------------------------

def one_thread(fn):
    """Run fn with one torch thread (the conftest does this for tests, not for module fixtures)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(n)


def pattern_samples(n: int, *, seed: int = 0, min_len: int = 24, max_len: int = 48) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Learnable sequences: 6 random tokens, then a random unit of 2-4 tokens repeated; loss on the repeats."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        T = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        p = int(torch.randint(2, 5, (1,), generator=g))
        unit = torch.randint(40, 120, (p,), generator=g)
        head = torch.randint(40, 120, (6,), generator=g)
        ids = torch.cat([head, unit.repeat(T // p + 1)])[:T]
        mask = torch.zeros(T, dtype=torch.uint8)
        mask[6:] = 1
        out.append((ids, mask))
    return out


def write_dump(out: Path, target, samples, *, target_name, hs_ids=None, dtype: str = "float32",
               shard_samples: int = 16) -> Path:
    """A dump in the shared format (dump.py), states captured with datagen's `capture_batch`."""
    from specwire.target.capture import capture_batch

    out = Path(out)
    out.mkdir(parents=True)
    hs_ids = list(hs_ids or default_hs_ids(target.num_layers))
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    shards, counts = [], torch.zeros(target.spec.vocab_size, dtype=torch.long)
    for k, a in enumerate(range(0, len(samples), shard_samples)):
        rows = samples[a:a + shard_samples]
        cap = capture_batch(target, [r[0].tolist() for r in rows], hs_ids, dtype=dt)
        lengths = [len(r[0]) for r in rows]
        t = {"input_ids": torch.cat([r[0] for r in rows]).long(),
             "loss_mask": torch.cat([r[1] for r in rows]).to(torch.uint8),
             "hidden": torch.cat(cap["hidden"]).cpu(), "last_hidden": torch.cat(cap["last_hidden"]).cpu(),
             "offsets": torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist()),
             "sample_index": torch.arange(a, a + len(rows))}
        save_tensors(out / shard_name(k), t, metadata={"format": SHARD_FORMAT, "hs_ids": ",".join(map(str, hs_ids))})
        counts += torch.bincount(t["input_ids"][t["loss_mask"].bool()], minlength=len(counts))
        shards.append({"file": shard_name(k), "samples": len(rows), "tokens": sum(lengths), "first_index": a,
                       "last_index": a + len(rows) - 1})
    save_tensors(out / VOCAB_COUNTS, {"counts": counts})
    write_json(out / MANIFEST, {
        "format": DUMP_FORMAT, "format_version": DUMP_FORMAT_VERSION,
        "wiring": expected_wiring(target, hs_ids).to_dict(), "target": str(target_name), "dtype": dtype,
        "max_length": 4096, "counts": {"samples": len(samples), "tokens": sum(s["tokens"] for s in shards),
                                       "loss_tokens": int(counts.sum())},
        "shards": shards, "options": {}, "complete": True})
    return out


def read_metrics(path: Path) -> list[dict]:
    """The records of a training run's metrics.jsonl."""
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


def base_config(data, out, **kw) -> TrainConfig:
    """A short training config on dump(s) `data` into `out`; `kw` replace any field."""
    defaults = dict(ttt_steps=3, batch_size=8, lr=3e-3, progress=False, log_every=1, save_every=1000)
    data = str(data) if isinstance(data, (str, Path)) else [str(d) for d in data]
    return TrainConfig(data=data, out=str(out), **{**defaults, **kw})


# ---- the engine: prompts and an oracle proposer --------------------------------------------------

def prompt_of(n: int, seed: int = 0) -> list[int]:
    """n random byte-token ids (a prompt for the tiny targets)."""
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class OracleProposer:
    """Proposes the reference continuation, with mistakes; the correct child is never the first one in a tree.

    Round r puts a wrong token at depth (r mod (steps + 2)) when that is < steps, so acceptance lengths vary
    from 0 to all. In a tree every node on the proposed path has a wrong first sibling, so accepting
    anything means keeping a non-contiguous branch of the target's KV cache.
    """

    hs_ids: tuple[int, ...] = ()

    def __init__(self, prompt: list[int], continuation: list[int], vocab: int):
        self.ref = list(prompt) + list(continuation)
        self.seq: list[int] = list(prompt[:1])
        self.vocab = vocab
        self.round = 0

    def _truth(self, i: int) -> int:
        return self.ref[i] if i < len(self.ref) else 0

    def propose(self, states, tokens, start, *, steps, spec, tree, params, generator) -> DraftTree:
        assert states is None and len(self.seq) == start + 1
        self.seq = self.seq[: start + 1] + tokens.tolist()
        n = len(self.seq)  # the root is seq[-1]; depth d predicts position n - 1 + d
        bad = self.round % (steps + 2) if steps else -1
        self.round += 1
        path = [self._truth(n + d) for d in range(steps)]
        if 0 <= bad < steps:
            path[bad] = (path[bad] + 1) % self.vocab
        root = tokens[-1]
        if not tree:
            return chain_tree(root, torch.tensor(path, dtype=torch.long))
        toks, parents, node = [int(root)], [-1], 0
        for d, tok in enumerate(path):
            toks += [(tok + 7) % self.vocab, tok]  # a wrong sibling first, then the proposal
            parents += [node, node]
            node = len(toks) - 1
        return DraftTree(tokens=torch.tensor(toks), parents=parents)


# ---- streaming text: a toy decode ----------------------------------------------------------------

def toy_decode(ids: list[int]) -> str:
    """Toy decode: id = code point, except 0, an 'é' whose second half is still missing when it is last."""
    s = "".join(chr(i) if i else "é" for i in ids)
    return s[:-1] + "\ufffd" if ids and ids[-1] == 0 else s


def feed_stream(stream, ids) -> list[str]:
    """Add `ids` one by one to a `TextStream`; the pieces it releases, then what `finish` releases."""
    pieces = []
    for i in ids:
        pieces.append(stream.add(i))
        if stream.stopped:  # a generation (the server's too) ends here
            return pieces
    return pieces + [stream.finish()]


def load_tool(name: str):
    """The script tools/NAME.py loaded as a module (the tools are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

"""Calibration data for the doctor: every hidden state of some text, captured here or read from a dump.

Owns: `Calibration` (target states at every hs index 0..L of calibration text, the token embeddings,
the target's greedy next tokens and which positions are scored), the built-in calibration prompts,
capturing from a loaded target (`capture_all_layers`, `builtin_calibration`, `data_calibration` over a
datagen dump), and the all-layer states dump that lets the search run here for targets too large to
run here (`dump_states`, `load_states`; docs/DOCTOR.md). Does not score wirings (`doctor.search`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, load_tensors, read_json, save_tensors, write_json
from specwire.wiring import num_hs_indices

STATES_FORMAT = "specwire-states"
STATES_FORMAT_VERSION = 1

# Built-in calibration prompts: varied (chat, code, maths, lists, facts), answered greedily by the target.
CALIBRATION_PROMPTS = (
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three benefits of regular exercise.",
    "What is 17 multiplied by 23? Show your steps.",
    "Translate 'good morning, my friend' into French and Spanish.",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Write a haiku about autumn leaves.",
    "How do vaccines train the immune system?",
    "Suggest a name for a small coffee shop and explain it.",
    "Describe the water cycle for a ten-year-old.",
)


# ---- calibration data: all L+1 states of some text ----------------------------------------------------------

@dataclass
class Calibration:
    """Target states of calibration text at every hs index, samples concatenated (the search's input).

    Sample s spans [offsets[s], offsets[s+1]). Position j holds token input_ids[j]; labels[j] is the
    target's greedy prediction of token j+1; score_mask[j] says whether that prediction is scored.
    """

    states: torch.Tensor  # [L+1, N, H_t]
    embeds: torch.Tensor  # [N, H] the target's input embedding of each token (what the draft embeds)
    input_ids: torch.Tensor  # [N] int64
    labels: torch.Tensor  # [N] int64
    score_mask: torch.Tensor  # [N] bool
    offsets: list[int]
    source: str = "built-in"

    @property
    def num_layers(self) -> int:
        return self.states.shape[0] - 1

    def draft_positions(self) -> "DraftPositions":
        """Step-0 inputs: at draft position t of a sample: g from states[:, t], embed(x_{t+1}), label of t+1."""
        rows, pos, sample = [], [], []
        for s in range(len(self.offsets) - 1):
            o, e = self.offsets[s], self.offsets[s + 1]
            for t in range(e - o - 1):
                rows.append(o + t)
                pos.append(t)
                sample.append(s)
        rows_t = torch.tensor(rows, dtype=torch.long)
        return DraftPositions(rows=rows_t, local=torch.tensor(pos, dtype=torch.long), sample=torch.tensor(sample),
                              labels=self.labels[rows_t + 1], scored=self.score_mask[rows_t + 1])


@dataclass
class DraftPositions:
    rows: torch.Tensor  # [Nd] calibration row of the hidden state (position t)
    local: torch.Tensor  # [Nd] position within the sample (rope position)
    sample: torch.Tensor  # [Nd] sample index
    labels: torch.Tensor  # [Nd] target id the draft should predict (target's greedy token at t+1)
    scored: torch.Tensor  # [Nd] bool


def greedy_continuations(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Prompt + the target's greedy continuation, batched with left padding (HF generate)."""
    tok = target.tokenizer
    pad = (tok.pad_token_id if tok is not None and tok.pad_token_id is not None else target.eos_token_ids[0])
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), n), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):] = torch.tensor(p)
        mask[i, n - len(p):] = 1
    with torch.no_grad():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                    eos_token_id=target.eos_token_ids)
    seqs = []
    eos = set(target.eos_token_ids)
    for i, p in enumerate(prompts):
        gen = out[i, n:].tolist()
        cut = []
        for t in gen:
            cut.append(t)
            if t in eos:
                break
        seqs.append(list(p) + cut)
    return seqs


@torch.no_grad()
def capture_all_layers(target, sequences: list[list[int]], score_from: list[int], *, source: str,
                       loss_masks: list[list[int]] | None = None) -> Calibration:
    """One pass per sample with hooks on every hs index 0..L; labels = the target's argmax."""
    from specwire.target.capture import capture_hidden_states

    L = target.num_layers
    states, embeds, ids_all, labels, masks, offsets = [], [], [], [], [], [0]
    for k, seq in enumerate(sequences):
        ids = torch.tensor([seq], device=target.device)
        cap = capture_hidden_states(target.model, ids, list(range(num_hs_indices(L))), with_logits=True, parts=target.parts)
        states.append(cap.states[:, 0].float())
        embeds.append(target.parts.embed(ids)[0].float())
        ids_all.append(ids[0])
        labels.append(cap.logits[0].argmax(-1))
        if loss_masks is not None:
            m = torch.tensor(loss_masks[k], dtype=torch.bool, device=target.device)
            # label j predicts token j+1: scored when token j+1 is an assistant token
            m = torch.cat([m[1:], m[-1:]])
        else:
            m = torch.zeros(len(seq), dtype=torch.bool, device=target.device)
            m[max(0, score_from[k] - 1):] = True
        masks.append(m)
        offsets.append(offsets[-1] + len(seq))
    return Calibration(states=torch.cat(states, 1), embeds=torch.cat(embeds), input_ids=torch.cat(ids_all),
                       labels=torch.cat(labels), score_mask=torch.cat(masks), offsets=offsets, source=source)


def builtin_calibration(target, *, num_prompts: int = 12, max_new_tokens: int = 40) -> Calibration:
    """The built-in prompts in the target's chat template plus their greedy continuations; scored on the continuation."""
    prompts = [target.encode_chat(p) for p in CALIBRATION_PROMPTS[:num_prompts]]
    seqs = greedy_continuations(target, prompts, max_new_tokens)
    return capture_all_layers(target, seqs, [len(p) for p in prompts], source=f"built-in ({len(prompts)} prompts)")


def data_calibration(target, data_dir: str | os.PathLike, *, max_samples: int = 12, max_tokens: int = 160) -> Calibration:
    """Conversations of a datagen dump (`conversations.jsonl`), scored on assistant tokens."""
    from specwire.data.dump import read_conversations

    recs = read_conversations(Path(data_dir) / "conversations.jsonl")[:max_samples]
    if not recs:
        raise SpecwireError(f"{data_dir}/conversations.jsonl has no conversations to calibrate on.")
    seqs = [r["input_ids"][:max_tokens] for r in recs]
    masks = [r["loss_mask"][:max_tokens] for r in recs]
    return capture_all_layers(target, seqs, [0] * len(seqs), source=f"--data {data_dir} ({len(seqs)} conversations)",
                              loss_masks=masks)


def data_prompts(data_dir: str | os.PathLike, *, limit: int = 3) -> list[list[int]]:
    """The prompt part (tokens before the first assistant token) of a dump's first conversations."""
    from specwire.data.dump import read_conversations

    out = []
    for r in read_conversations(Path(data_dir) / "conversations.jsonl")[:limit]:
        first = next((j for j, m in enumerate(r["loss_mask"]) if m), len(r["loss_mask"]))
        if first > 0:
            out.append(list(r["input_ids"][:first]))
    return out


# ---- the all-layer states dump (for targets too large to run here) -------------------------------------------

def _encode_prompt(target, p) -> list[int]:
    """A PromptRecord or a string (chat template applied), or a list of token ids (taken as is)."""
    if hasattr(p, "messages"):
        return target.encode_chat(list(p.messages))
    if isinstance(p, str):
        return target.encode_chat(p)
    return [int(i) for i in p]


def dump_states(target, prompts, out: str | os.PathLike, *, max_new_tokens: int = 40, dtype: str = "float32",
                target_name: str | None = None) -> Path:
    """Write every hs index of the target on calibration text, so the search can run elsewhere (docs/DOCTOR.md)."""
    from specwire.target.load import chat_template_hash, tokenizer_fingerprint

    enc = [_encode_prompt(target, p) for p in prompts]
    seqs = greedy_continuations(target, enc, max_new_tokens) if max_new_tokens > 0 else enc
    cal = capture_all_layers(target, seqs, [len(p) for p in enc], source="dump-states")
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if dt is None:
        raise SpecwireError(f"dump-states --dtype {dtype}: expected float32 or bfloat16.")
    out = Path(out)
    samples = []
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for s in range(len(cal.offsets) - 1):
            o, e = cal.offsets[s], cal.offsets[s + 1]
            name = f"states-{s:05d}.safetensors"
            save_tensors(tmp / name, {
                "states": cal.states[:, o:e].to(dt), "embeds": cal.embeds[o:e].to(dt),
                "input_ids": cal.input_ids[o:e].long(), "labels": cal.labels[o:e].long(),
                "score_mask": cal.score_mask[o:e].to(torch.uint8)})
            samples.append({"file": name, "tokens": e - o, "prompt_tokens": len(enc[s])})
        manifest = {
            "format": STATES_FORMAT, "format_version": STATES_FORMAT_VERSION,
            "target": {"name": target_name or target.info.name, **target.spec.to_dict(),
                       "max_position_embeddings": target.info.max_position_embeddings},
            "tokenizer_fingerprint": tokenizer_fingerprint(target.tokenizer) if target.tokenizer is not None else None,
            "chat_template_hash": chat_template_hash(target.tokenizer) if target.tokenizer is not None else None,
            "dtype": dtype, "num_hs": num_hs_indices(target.num_layers), "samples": samples,
            "options": {"max_new_tokens": max_new_tokens}, "complete": True,
        }
        write_json(tmp / "manifest.json", manifest)
    return out


def load_states(path: str | os.PathLike, tv) -> tuple[Calibration, dict]:
    """Read a states dump, refusing one captured on another target (`tv`: a `doctor.checks.TargetView`)."""
    path = Path(path)
    m = read_json(path / "manifest.json", what="states dump manifest")
    if m.get("format") != STATES_FORMAT or m.get("format_version") != STATES_FORMAT_VERSION:
        raise SpecwireError(f"{path / 'manifest.json'}: format {m.get('format')!r} v{m.get('format_version')!r}, "
                            f"expected {STATES_FORMAT!r} v{STATES_FORMAT_VERSION} (written by `specwire dump-states`).")
    if not m.get("complete"):
        raise SpecwireError(f"{path}: the states dump is incomplete; rerun `specwire dump-states`.")
    t = m.get("target") or {}
    for k in ("num_layers", "hidden_size", "vocab_size", "architecture"):
        if t.get(k) != getattr(tv.spec, k):
            raise SpecwireError(f"{path / 'manifest.json'}: target.{k} is {t.get(k)!r}, the target given has "
                                f"{getattr(tv.spec, k)!r}: the states were captured on another model.",
                                fix="pass the target the dump was made from, or dump it again.")
    if tv.spec.fingerprint and t.get("fingerprint") and t["fingerprint"] != tv.spec.fingerprint:
        raise SpecwireError(f"{path}: captured on target fingerprint {t['fingerprint']}, the target given is {tv.spec.fingerprint}.")
    L, H = tv.num_layers, tv.info.hidden_size
    states, embeds, ids, labels, masks, offsets = [], [], [], [], [], [0]
    for s in m.get("samples") or []:
        f = path / str(s.get("file"))
        d = load_tensors(f)
        want = {"states", "embeds", "input_ids", "labels", "score_mask"}
        if set(d) != want:
            raise SpecwireError(f"{f}: tensors {sorted(d)}, expected {sorted(want)}.")
        T = d["input_ids"].shape[0]
        shapes = {"states": (num_hs_indices(L), T, H), "embeds": (T, H), "labels": (T,), "score_mask": (T,)}
        for k, sh in shapes.items():
            if tuple(d[k].shape) != sh:
                raise SpecwireError(f"{f}: '{k}' has shape {tuple(d[k].shape)}, expected {sh} (L+1={L + 1}, H={H}).")
        states.append(d["states"].float())
        embeds.append(d["embeds"].float())
        ids.append(d["input_ids"].long())
        labels.append(d["labels"].long())
        masks.append(d["score_mask"].bool())
        offsets.append(offsets[-1] + T)
    if not states:
        raise SpecwireError(f"{path / 'manifest.json'}: no samples listed.")
    cal = Calibration(torch.cat(states, 1), torch.cat(embeds), torch.cat(ids), torch.cat(labels), torch.cat(masks),
                      offsets, source=f"--states {path} ({len(states)} samples)")
    return cal, m

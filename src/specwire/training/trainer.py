"""Training an EAGLE-3 draft with training-time test (TTT): the loop behind `specwire train`.

Owns: `train()` (single process or under `torchrun`), the learning-rate schedule (`lr_at`), the fresh
draft's initialisation (`build_draft`), the metrics log (OUT/metrics.jsonl) and `TrainResult`. Does not
own the TTT maths and the unroll (`training.ttt`), the configuration (`training.config`), data and batch
order (`training.batches`), process groups (`training.dist`), checkpoints (`training.checkpoint`), the
validation loop and its report (`training.evaluate`), the draft module (`draft.model`) or the command
line (`cli.train`).

One optimizer step: the global batch (`batches.epoch_batches`) is split by rank (`rank_share`) and into
forward passes under a token budget (`micro_batches`); each pass runs the K-step unroll and adds its
gradient; the loss is normalised by the global number of loss tokens per step (one small all-reduce), and
gradients are summed over ranks with one all-reduce of a flat buffer before clipping (`dist`). Every
`save_every` steps (and at the end) the run is checkpointed atomically; a rerun of the same command
resumes from OUT/checkpoint and reproduces the uninterrupted run step for step. At the end the draft is
validated (`evaluate.measure`) and written to OUT/draft as a native checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specwire.draft.checkpoint import save_draft
from specwire.draft.model import DraftConfig, Eagle3Draft
from specwire.errors import SpecwireError
from specwire.safeio import atomic_path
from specwire.target.heap import release_freed_memory
from specwire.training.batches import (DataSet, epoch_batches, load_run_data, manifest_target, materialize,
                                       micro_batches, rank_share)
from specwire.training.checkpoint import load_checkpoint, recover_run_folder, save_checkpoint
from specwire.training.config import DEFAULT_DRAFT_VOCAB, TrainConfig
from specwire.training.dist import Dist, all_reduce_grads, init_dist
from specwire.training.evaluate import measure, summarize
from specwire.training.rundir import BEST_DIR, CHECKPOINT_DIR, DRAFT_DIR, METRICS_FILE, RunPaths
from specwire.training.ttt import TargetHeads, Totals, add_noise, collate, step_counts, step_weights, ttt_unroll
from specwire.wiring import Wiring

log = logging.getLogger("specwire")


def lr_at(step: int, *, total: int, lr: float, warmup_ratio: float) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine decay to 0."""
    warmup = int(math.ceil(warmup_ratio * total))
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))



def build_draft(target, wiring: Wiring, vocab_counts: torch.Tensor, *, draft_vocab_size: int | None,
                norm_before_residual: bool, init_lm_head: str, seed: int, device,
                init_layer: str = "random") -> Eagle3Draft:
    """A fresh draft for `target`: vocab map from the counts, seeded init (the layer from a target layer with
    init_layer "target[:N]"), embeddings attached."""
    from specwire.draft.vocab import build_vocab_map

    V = target.spec.vocab_size
    vd = min(DEFAULT_DRAFT_VOCAB, V) if draft_vocab_size is None else draft_vocab_size
    if vd > V:
        raise SpecwireError(f"--draft-vocab-size {vd} exceeds the target vocabulary ({V}).", fix=f"use at most {V}.")
    d2t, t2d = build_vocab_map(vocab_counts, vd)
    cfg = DraftConfig.for_target(target.model.config, wiring, draft_vocab_size=vd,
                                 norm_before_residual=norm_before_residual)
    draft = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for m in draft.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=g)  # PyTorch's default Linear init
                if m.bias is not None:
                    bound = 1 / math.sqrt(m.in_features)
                    nn.init.uniform_(m.bias, -bound, bound, generator=g)
        if init_lm_head == "target":
            ids = torch.arange(vd) + d2t
            draft.lm_head.weight.copy_(target.parts.lm_head.weight.detach()[ids.to(target.device)].float().cpu())
            nw = getattr(target.parts.final_norm, "weight", None)
            if nw is not None and tuple(nw.shape) == tuple(draft.norm.weight.shape):
                draft.norm.weight.copy_(nw.detach().float().cpu())
        if init_layer != "random":
            n = int(init_layer.partition(":")[2] or -1)
            copy_target_layer(draft.layers[0], target.parts.layers, n)
    draft.set_vocab_map(d2t, t2d)
    draft.to(device)
    draft.attach_embeddings(target.parts.embed)
    return draft


def warm_start_draft(config: TrainConfig, target, wiring: Wiring, *, source: str, device,
                     vocab_counts: torch.Tensor) -> Eagle3Draft:
    """The draft `config.init_draft` names, in fp32, to continue training on new data: its weights and vocab map
    (a curriculum: e.g. the pool first, then self-instruct). Its wiring must be the data's; its geometry wins
    over the run's draft flags, which must agree or stay unset. With `config.refit_vocab` its vocabulary is
    chosen again from `vocab_counts` (the run's data), at --draft-vocab-size or its own size."""
    from specwire.draft.checkpoint import load_draft, resolve_draft_path

    path = resolve_draft_path(config.init_draft)
    draft = load_draft(path, dtype=torch.float32)
    mine = draft.config.wiring
    mine.check_compatible(wiring, expected_from=f"--init-draft {path}", found_in=source,
                          ignore=("norm_before_residual", "draft_vocab_size"))
    asked = {"draft_vocab_size": config.draft_vocab_size, "norm_before_residual": config.norm_before_residual or None}
    if config.refit_vocab:
        del asked["draft_vocab_size"]  # a refit may change the size
    for name, want in asked.items():  # None: not asked for, the checkpoint's value stands
        have = getattr(draft.config, name)
        if want is not None and want != have:
            raise SpecwireError(f"--init-draft {path}: its {name} is {have}, but the run asks for {want}.",
                                fix=f"drop --{name.replace('_', '-')} (a warm start keeps the checkpoint's), or start fresh.")
    if config.refit_vocab:
        draft = refit_vocab(draft, target, vocab_counts, config.draft_vocab_size or draft.config.draft_vocab_size)
    draft.train()
    draft.to(device)
    draft.attach_embeddings(target.parts.embed)
    return draft


def refit_vocab(draft: Eagle3Draft, target, counts: torch.Tensor, size: int) -> Eagle3Draft:
    """`draft` with its vocabulary chosen again: the `size` most frequent target ids of `counts` (the new data's
    trained tokens). Every other weight is kept; lm_head rows come from `draft.vocab.refit_rows`."""
    from specwire.draft.vocab import VocabMap, build_vocab_map, coverage, refit_rows

    old_ids = VocabMap(draft.d2t.cpu(), draft.t2d.cpu()).target_ids  # shape: [Vd_old]
    vocab = build_vocab_map(counts, size)  # refuses a size outside the target vocabulary
    new_ids = vocab.target_ids  # shape: [Vd_new]
    target_rows = target.parts.lm_head.weight.detach()[new_ids.to(target.device)].float().cpu()  # shape: [Vd_new, H]
    rows = refit_rows(draft.lm_head.weight.detach().float().cpu(), old_ids, new_ids, target_rows)
    kept = int(torch.isin(new_ids, old_ids).sum())
    log.info("refit_vocab: %d of %d ids kept, %d new; coverage of the run's data %.2f%% -> %.2f%%", kept, size, size - kept,
             100 * coverage(counts, draft.t2d.cpu().bool()), 100 * coverage(counts, vocab.t2d))
    state = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    c = draft.config
    refit = Eagle3Draft(dataclasses.replace(c, draft_vocab_size=size,
                                            wiring=dataclasses.replace(c.wiring, draft_vocab_size=size)))
    refit.load_state_dict({**state, "lm_head.weight": rows, "d2t": vocab.d2t, "t2d": vocab.t2d})
    return refit


def copy_target_layer(layer: nn.Module, target_layers: nn.ModuleList, index: int) -> None:
    """Start the draft layer as target layer `index` (negative counts from the end).

    The draft's q/k/v read [embeddings | hidden] (2H wide): the hidden half gets the target layer's
    weights (the draft's hidden plays the residual stream's part) and the embedding half keeps its random
    init. o_proj, the MLP and the norms are copied as they are. Llama-style layers only; another layout
    (GPT-2's fused Conv1D, mixture-of-experts MLPs) or another size is refused.
    """
    L = len(target_layers)
    if not -L <= index < L:
        raise SpecwireError(f"init_layer: the target has {L} layers (0..{L - 1}), found layer {index}.")
    src = target_layers[index]
    names = {n: p for n, p in src.named_parameters()}
    H = layer.hidden_norm.weight.shape[0]
    for proj in ("q_proj", "k_proj", "v_proj"):
        w = names.get(f"self_attn.{proj}.weight")
        mine = getattr(layer.self_attn, proj)
        if w is None or tuple(w.shape) != (mine.weight.shape[0], H):
            raise SpecwireError(f"init_layer: target layer {index} has no Llama-style self_attn.{proj} of shape "
                                f"{(mine.weight.shape[0], H)} (found {None if w is None else tuple(w.shape)}).",
                                fix="use --init-layer random.")
        mine.weight[:, H:].copy_(w.detach().float())
        b = names.get(f"self_attn.{proj}.bias")
        if b is not None and mine.bias is not None:
            mine.bias.copy_(b.detach().float())
    plain = {"self_attn.o_proj.weight": layer.self_attn.o_proj.weight, "mlp.gate_proj.weight": layer.mlp.gate_proj.weight,
             "mlp.up_proj.weight": layer.mlp.up_proj.weight, "mlp.down_proj.weight": layer.mlp.down_proj.weight,
             "input_layernorm.weight": layer.hidden_norm.weight,
             "post_attention_layernorm.weight": layer.post_attention_layernorm.weight}
    for name, mine in plain.items():
        w = names.get(name)
        if w is None or tuple(w.shape) != tuple(mine.shape):
            raise SpecwireError(f"init_layer: target layer {index} has no {name} of shape {tuple(mine.shape)} "
                                f"(found {None if w is None else tuple(w.shape)}).", fix="use --init-layer random.")
        mine.copy_(w.detach().float())
    layer.input_layernorm.weight.copy_(names["input_layernorm.weight"].detach().float())


def _val_report(totals: Totals, config: TrainConfig, n_val: int) -> dict:
    """A validation's `evaluate.EvalResult` as JSON: what the metrics, OUT/best and the final draft record."""
    n = n_val if config.eval_max_samples is None else min(n_val, config.eval_max_samples)
    return summarize(totals, split="val" if config.eval_data is None else "eval_data", n_samples=n).to_dict()


def _best_so_far(path: Path, start: int) -> tuple[int, float] | None:
    """The best periodic validation a resumed run had reached by its checkpoint's step (None: none yet,
    or one saved after that step, which the resumed run measures again)."""
    if not (path / "config.json").is_file():
        return None
    from specwire.draft.checkpoint import read_native_config

    t = read_native_config(path)[1].get("specwire", {}).get("training") or {}
    al = (t.get("val") or {}).get("predicted_accept_length")
    if not isinstance(t.get("steps"), int) or t["steps"] > start or not isinstance(al, float):
        return None
    return t["steps"], al


def _take_best(draft: Eagle3Draft, path: Path) -> dict:
    """Load the best periodic validation's weights into `draft`; returns that validation's report."""
    from specwire.draft.checkpoint import WEIGHTS_FILE, read_native_config
    from specwire.safeio import load_tensors

    tensors = load_tensors(path / WEIGHTS_FILE)
    draft.load_state_dict({k: v.to(draft.fc.weight.device) for k, v in tensors.items()}, strict=True)
    best = read_native_config(path)[1]["specwire"]["training"]
    return {**best["val"], "selected_step": best["steps"]}


@dataclass
class TrainResult:
    """What a finished (or stopped) run produced."""

    out_dir: Path  # the run folder (TrainConfig.out)
    draft_dir: Path | None  # OUT/draft (None when stopped before the end)
    checkpoint_dir: Path  # OUT/checkpoint
    metrics_path: Path  # OUT/metrics.jsonl
    steps: int  # optimizer steps completed in total
    total_steps: int  # steps of the full schedule
    resumed_from: int  # step the run resumed from (0: fresh)
    train: dict  # last logged training metrics
    val: dict | None  # final validation summary (evaluate.EvalResult.to_dict())
    tokens_per_s: float  # loss tokens (step 0) per second of training in this invocation
    finished: bool  # the whole schedule ran (False: stopped early; rerun the same command to resume)
    data_dirs: list[str]  # the data folders the run read (TrainConfig.data as a list)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("out_dir", "draft_dir", "checkpoint_dir", "metrics_path"):
            d[k] = None if d[k] is None else str(d[k])
        return d


def _append_jsonl(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()


def _trim_metrics(path: Path, step: int, *, final: bool) -> None:
    """On resume from `step`, drop the records that the resumed run writes again: everything after the
    checkpoint, and the end-of-run validation when the run had already finished (`final`)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        s = int(rec.get("step", 0))
        if s < step or (s == step and not (final and rec.get("kind") == "val")):
            keep.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(l + "\n" for l in keep))


def validate(draft, heads: TargetHeads, data: DataSet, *, config: TrainConfig, d: Dist, target, hs_ids,
             device) -> Totals:
    """Per-step sums over a validation set (this rank's share of it, all-reduced): `evaluate.measure`,
    with online samples captured on the way."""
    n = len(data) if config.eval_max_samples is None else min(len(data), config.eval_max_samples)
    return measure(draft, heads, data.samples[:n], steps=config.ttt_steps, batch_tokens=config.batch_tokens,
                   max_length=config.max_length, device=device, dist=d,
                   prepare=lambda chunk: materialize(chunk, target=target, hs_ids=hs_ids, max_length=config.max_length))


def train(config: TrainConfig) -> TrainResult:
    """Train (or resume training) a draft; see the module docstring. Runs single-process or under torchrun."""
    from specwire.target.load import load_target

    d, device = init_dist(config.device)
    try:
        return _train(config, d, device, load_target)
    finally:
        if d.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _train(config: TrainConfig, d: Dist, device: torch.device, load_target) -> TrainResult:
    out = Path(config.out)
    run = RunPaths(out)
    ckpt_dir, metrics_path, draft_dir = run.checkpoint_dir, run.metrics_path, run.draft_dir
    target_name = config.target or manifest_target(config.data_dirs[0])
    if target_name is None:
        raise SpecwireError(f"{config.data_dirs[0]}: no manifest names the target.", fix="pass --target NAME_OR_PATH.")
    target = load_target(target_name, device=device, dtype=config.target_dtype)
    if config.autocast and device.type == "cpu" and d.main:
        from specwire.target.cpu import native_bf16

        if not native_bf16():
            # measured on an AVX2-only EPYC, 2 threads: 55 s per step against 5.5 s in fp32 (docs/MODEL_CARD.md)
            log.warning("--autocast: this CPU has no native bf16 (AMX or AVX512-BF16), so bf16 is emulated and "
                        "training runs several times slower than fp32; drop --autocast here.")
    data = load_run_data(config, target)
    if len(data.train) == 0:
        raise SpecwireError(f"{data.source}: the train split is empty.")
    hs_ids = list(data.wiring.hs_ids)
    if config.init_draft is None:
        draft = build_draft(target, data.wiring, data.vocab_counts, draft_vocab_size=config.draft_vocab_size,
                            norm_before_residual=config.norm_before_residual, init_lm_head=config.init_lm_head,
                            seed=config.seed, device=device, init_layer=config.init_layer)
    else:
        draft = warm_start_draft(config, target, data.wiring, source=data.source, device=device,
                                 vocab_counts=data.vocab_counts)
    heads = TargetHeads(target.parts.final_norm, target.parts.lm_head, draft.d2t, device=device)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
                            foreach=False)

    lengths = data.train.lengths()
    per_epoch = math.ceil(len(data.train) / config.batch_size)
    total = max(1, int(math.ceil(config.epochs * per_epoch)))
    if config.max_steps is not None:
        total = min(total, config.max_steps)

    start = 0
    if d.main:
        recover_run_folder(out, (CHECKPOINT_DIR, DRAFT_DIR, BEST_DIR, METRICS_FILE))
    d.barrier()
    if (ckpt_dir / "state.json").is_file():
        start = load_checkpoint(ckpt_dir, draft=draft, optimizer=opt, config=config)
        draft.attach_embeddings(target.parts.embed)
        heads = TargetHeads(target.parts.final_norm, target.parts.lm_head, draft.d2t, device=device)
        if d.main:
            _trim_metrics(metrics_path, start, final=start >= total)
            log.info("resuming %s from step %d of %d", ckpt_dir, start, total)
    elif d.main:
        out.mkdir(parents=True, exist_ok=True)
        if metrics_path.exists():
            metrics_path.unlink()
    d.barrier()

    best = _best_so_far(run.out / BEST_DIR, start) if d.main else None  # (step, predicted accept length)
    bar = None
    if d.main and config.progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
    K = config.ttt_steps
    weights = step_weights(K)
    window = Totals(K)
    window.vec = window.vec.to(device)
    win_loss, win_steps, last_train = 0.0, 0, {}
    loss_tokens, t0 = 0.0, time.perf_counter()
    batches_cache: dict[int, list[list[int]]] = {}
    step = start
    done_here = 0
    draft.train()
    while step < total:
        if config.stop_after is not None and done_here >= config.stop_after:
            break
        epoch, b = divmod(step, per_epoch)
        if epoch not in batches_cache:
            batches_cache = {epoch: epoch_batches(lengths, batch_size=config.batch_size, seed=config.seed, epoch=epoch)}
        gbatch = batches_cache[epoch][b]
        mine = rank_share(gbatch, lengths, d)
        lr = lr_at(step, total=total, lr=config.lr, warmup_ratio=config.warmup_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        # global per-step token counts normalise the loss (the same on every rank)
        norm = torch.zeros(K, dtype=torch.float64, device=device)
        for i in mine:
            s = data.train.samples[i]
            norm += step_counts(s["loss_mask"][:config.max_length].to(device), K).double()
        d.all_sum(norm)
        loss_tokens += float(norm[0])
        norm = norm.float()
        opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for mb in micro_batches(mine, lengths, batch_tokens=config.batch_tokens, max_length=config.max_length):
            samples = materialize([data.train.samples[i] for i in mb], target=target, hs_ids=hs_ids,
                                  max_length=config.max_length)
            batch = collate(samples, max_length=config.max_length, device=device)
            if config.noise_std:
                add_noise(batch.hidden, config.noise_std, seed=config.seed, step=step, part=mb[0])
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.autocast):
                stats = ttt_unroll(draft, heads, batch, steps=K, norm=norm, weights=weights, loss_kind=config.loss)
            stats.loss.backward()
            step_loss += stats.loss.detach()
            window.add(stats)
        all_reduce_grads(params, d)
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        opt.step()
        step += 1
        done_here += 1
        win_loss += float(d.all_sum(step_loss))
        win_steps += 1
        if bar is not None:
            s0 = window.vec
            bar.update(1)
            bar.set_postfix(loss=f"{win_loss / win_steps:.3f}", acc0=f"{float(s0[K] / max(float(s0[3 * K]), 1.0)):.3f}")
        if step % config.log_every == 0 or step == total:
            d.all_sum(window.vec)
            summ = window.summary()
            last_train = {"kind": "train", "step": step, "epoch": step / per_epoch, "lr": lr,
                          "loss": win_loss / win_steps, **summ}
            if d.main:
                _append_jsonl(metrics_path, last_train)
            window = Totals(K)
            window.vec = window.vec.to(device)
            win_loss, win_steps = 0.0, 0
        if config.eval_every and step % config.eval_every == 0 and step != total and len(data.val):
            vt = validate(draft, heads, data.val, config=config, d=d, target=target, hs_ids=hs_ids, device=device)
            report = _val_report(vt, config, len(data.val))
            if d.main:
                al = report["predicted_accept_length"]
                _append_jsonl(metrics_path, {"kind": "val", "step": step, **vt.summary(), "predicted_accept_length": al})
                if best is None or al > best[1]:
                    best = (step, al)
                    save_draft(draft, run.out / BEST_DIR, extra={"training": {"steps": step, "val": report}})
        if step % config.save_every == 0 or step == total:
            if d.main:
                save_checkpoint(ckpt_dir, draft=draft, optimizer=opt, step=step, config=config, total_steps=total)
            d.barrier()
            release_freed_memory()  # where the heap keeps freed blocks (`target.heap`): hand them back now and then
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    finished = step >= total
    val = None
    if finished:
        if len(data.val):
            vt = validate(draft, heads, data.val, config=config, d=d, target=target, hs_ids=hs_ids, device=device)
            val = _val_report(vt, config, len(data.val))
            if d.main:
                _append_jsonl(metrics_path, {"kind": "val", "step": step, **vt.summary(),
                                             "predicted_accept_length": val["predicted_accept_length"]})
        selected = step
        if d.main and config.select == "best" and best is not None and val is not None \
                and best[1] > val["predicted_accept_length"]:
            selected = best[0]
            val = _take_best(draft, run.out / BEST_DIR)
            log.info("final draft: step %d (held-out predicted accept length %.3f), not the last step", *best)
        if d.main:
            data = config.data_dirs[0] if len(config.data_dirs) == 1 else config.data_dirs  # a folder, or the list
            extra = {"training": {"steps": step, "selected_step": selected, "ttt_steps": K, "data": data,
                                  "target": target_name, "online": config.online,
                                  "config": config.to_dict(), "val": val}}
            save_draft(draft, draft_dir, extra=extra, verifier_path=str(target.info.path))
        d.barrier()
    return TrainResult(out_dir=out, draft_dir=draft_dir if finished else None, checkpoint_dir=ckpt_dir,
                       metrics_path=metrics_path, steps=step, total_steps=total, resumed_from=start,
                       train=last_train, val=val, tokens_per_s=loss_tokens / elapsed if elapsed > 0 else 0.0,
                       finished=finished, data_dirs=config.data_dirs)

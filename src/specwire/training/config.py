"""The configuration of a training run: `TrainConfig`, each default written once.

Owns: `TrainConfig` (the fields, their defaults, their one-line help as trailing comments, validation
in `__post_init__`, JSON round trip), the draft-vocabulary default and the list of fields a resumed run
may change. `specwire train`'s flags are generated from these fields (`specwire.cli.train`). Does not
own what the fields do: the loop (`training.trainer`), data (`training.batches`), checkpoints
(`training.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Union

from specwire.errors import SpecwireError

DEFAULT_TTT_STEPS = 5  # K, unrolled TTT steps: the one default `train` and `eval` share
DEFAULT_DRAFT_VOCAB = 16384  # capped at the target vocab; see TrainConfig.draft_vocab_size
LOSSES = ("kl", "top1")  # training.ttt.ttt_unroll's losses
# TrainConfig fields that may change between a run and its resumption (everything else must match).
RESUME_FREE_FIELDS = ("out", "eval_every", "save_every", "log_every", "eval_max_samples", "progress", "stop_after",
                      "device", "batch_tokens", "select")


@dataclass
class TrainConfig:
    """Everything `train` needs. The CLI generates its flags from these fields; tests build it directly."""

    # typing.Union (not "|"): the flag generator reads it as "one or more values"
    data: Union[str, list[str]]  # dump folder(s), merged after each is checked against the wiring (online: datagen or selfinstruct folders)
    out: str  # run folder (checkpoint/, draft/, metrics.jsonl)
    target: str | None = None  # target name/path; default: the one the dump's manifest names
    hs_ids: list[int] | None = None  # expected fused hs ids; default: the dump's (online: EAGLE-3 default)
    online: bool = False  # capture target states per batch from the folders' conversations instead of shards
    eval_data: str | None = None  # separate validation dump; default: the dump's own val split
    ttt_steps: int = DEFAULT_TTT_STEPS  # unrolled draft steps K
    draft_vocab_size: int | None = None  # draft vocabulary (default: min(16384, target vocab))
    norm_before_residual: bool = False  # draft layer residual is hidden_norm(h)
    init_lm_head: str = "target"  # "target": lm_head/norm start as the target's rows; "random": default init
    init_layer: str = "random"  # "random", or "target[:N]": the draft layer starts as target layer N (default: the last)
    init_draft: str | None = None  # warm start: a draft checkpoint (folder or shipped name) whose weights and vocab map the run starts from
    refit_vocab: bool = False  # with init_draft: choose the draft vocabulary again from this run's data (its most frequent trained tokens); ids that stay keep their lm_head rows, new ids start from the target's rows mapped onto the draft's
    noise_std: float = 0.0  # std of Gaussian noise added to the fused target states while training (not validating)
    loss: str = "kl"  # "kl": KL(target || draft) over the draft vocab; "top1": cross-entropy on the target's argmax
    autocast: bool = False  # the draft's forward and backward under bf16 autocast (weights, optimizer, targets stay fp32)
    select: str = "best"  # the final draft: "best" held-out predicted accept length among validations, or "last"
    epochs: float = 1.0  # passes over the train split (fractions allowed)
    max_steps: int | None = None  # cap on optimizer steps (changes the schedule's length)
    max_train_samples: int | None = None  # train on the first N samples of the train split only (learning curves, ablations)
    skip_train_samples: int = 0  # skip the first N samples of the train split (a later stage continues on samples an earlier one never saw)
    batch_size: int = 8  # samples per optimizer step, over all ranks (the global batch)
    batch_tokens: int = 8192  # max padded tokens per forward pass on one rank (larger batches accumulate)
    max_length: int = 2048  # samples are truncated to this many tokens
    lr: float = 1e-4  # AdamW peak learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas (no flag)
    warmup_ratio: float = 0.015  # linear warm-up share of the steps, then cosine decay to 0
    max_grad_norm: float = 0.5  # gradient clipping
    seed: int = 0  # draft init and data order
    eval_every: int = 0  # validation every N steps (0: only at the end)
    eval_max_samples: int | None = None  # cap on validation samples (None: the whole split)
    save_every: int = 200  # checkpoint every N steps (and at the end)
    log_every: int = 10  # a metrics.jsonl record every N steps (covering the steps since the last one)
    device: str | None = None  # default: cuda when available, else cpu
    target_dtype: str = "float32"  # weights dtype of the target (its norm and lm_head make the soft targets; the draft trains in float32)
    progress: bool = True  # progress bar on rank 0
    stop_after: int | None = None  # stop this invocation after N more steps, as if killed (tests, time boxes)

    def __post_init__(self):
        if not isinstance(self.data, str):
            self.data = [str(d) for d in self.data]
            if not self.data:
                raise SpecwireError("TrainConfig.data: expected a dump folder, found an empty list.")
            if len(self.data) == 1:
                self.data = self.data[0]
        if self.hs_ids is not None:
            self.hs_ids = [int(i) for i in self.hs_ids]
        self.betas = tuple(float(b) for b in self.betas)
        positive = ("ttt_steps", "batch_size", "batch_tokens", "max_length", "save_every", "log_every")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecwireError(f"TrainConfig.{name}: expected a positive integer, found {v!r}.")
        for name in ("max_steps", "max_train_samples", "stop_after", "eval_max_samples", "draft_vocab_size"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise SpecwireError(f"TrainConfig.{name}: expected a positive integer or None, found {v!r}.")
        if not isinstance(self.skip_train_samples, int) or isinstance(self.skip_train_samples, bool) or self.skip_train_samples < 0:
            raise SpecwireError(f"TrainConfig.skip_train_samples: expected an integer >= 0, found {self.skip_train_samples!r}.")
        if self.eval_every < 0:
            raise SpecwireError(f"TrainConfig.eval_every: expected >= 0, found {self.eval_every}.")
        if not self.epochs > 0:
            raise SpecwireError(f"TrainConfig.epochs: expected > 0, found {self.epochs}.")
        if not self.lr > 0:
            raise SpecwireError(f"TrainConfig.lr: expected > 0, found {self.lr}.")
        if not 0 <= self.warmup_ratio < 1:
            raise SpecwireError(f"TrainConfig.warmup_ratio: expected a value in [0, 1), found {self.warmup_ratio}.")
        if not self.max_grad_norm > 0:
            raise SpecwireError(f"TrainConfig.max_grad_norm: expected > 0, found {self.max_grad_norm}.")
        if self.init_layer != "random" and not re.fullmatch(r"target(:-?\d+)?", self.init_layer):
            raise SpecwireError(f"TrainConfig.init_layer: expected 'random', 'target' or 'target:N', found {self.init_layer!r}.")
        if not (isinstance(self.noise_std, (int, float)) and self.noise_std >= 0):
            raise SpecwireError(f"TrainConfig.noise_std: expected a number >= 0, found {self.noise_std!r}.")
        if self.loss not in LOSSES:
            raise SpecwireError(f"TrainConfig.loss: expected one of {', '.join(LOSSES)}, found {self.loss!r}.")
        if self.select not in ("best", "last"):
            raise SpecwireError(f"TrainConfig.select: expected 'best' or 'last', found {self.select!r}.")
        if self.init_draft is not None and self.init_layer != "random":
            raise SpecwireError(f"TrainConfig.init_draft: a warm start takes the layer from {self.init_draft}, "
                                f"so init_layer must stay 'random', found {self.init_layer!r}.")
        if self.refit_vocab and self.init_draft is None:
            raise SpecwireError("TrainConfig.refit_vocab: chooses a trained draft's vocabulary again, so it needs "
                                "init_draft (a fresh draft already takes its vocabulary from the data).")
        if self.init_lm_head not in ("target", "random"):
            raise SpecwireError(f"TrainConfig.init_lm_head: expected 'target' or 'random', found {self.init_lm_head!r}.")

    @property
    def data_dirs(self) -> list[str]:
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecwireError(f"train config: unknown fields {unknown}.")
        return cls(**d)

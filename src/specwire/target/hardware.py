"""This machine as a place to decode: the measured cost of a target pass, and its cache.

Scope: `KernelChoice` (a dtype and a way of computing the linear layers), `CostCurve` (milliseconds of
one target pass over T new tokens, for T = 1..17, and the row padding that makes that kernel
batch-invariant), `measure_pass_ms` / `measure_curve` on a loaded target, the cache of curves under
$SPECWIRE_HOME/hardware, and `generation_dtype`. The CPU's model and features come from `target.cpu`.
Does not decide anything: `decode.kernels` picks the default kernel from these curves and
`decode.budget` the speculation budget.

Why a cache, and why keyed so strictly: a cost curve is only true for the CPU model and its features,
the thread count, the torch version, the device, the compiled kernels and the target it was measured on. The cache file name
hashes all of them, and the file repeats them; a file whose recorded key differs from this process's
(copied from another machine, edited, or written by another torch) is ignored and measured again,
never trusted.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specwire.safeio import write_json
from specwire.target.cpu import cpu_features, cpu_model, native_bf16
from specwire.wiring import short_hash

CACHE_FORMAT = 3  # 3: the leading kernels' curves are measured side by side (`CostCurve.beside`)
PASS_TOKENS = tuple(range(1, 18))  # pass sizes measured: a root plus up to 16 draft tokens
log = logging.getLogger("specwire")

def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer read next measures it (CPU work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generation_dtype(requested: str, device: str | None) -> str:
    """The weights dtype for batched generation (datagen, self-instruct): `requested`, or for "auto"
    bfloat16 on CUDA or on a CPU with native bf16 (its GEMMs at 64+ rows run about 4x faster than fp32
    on an AVX512-BF16 CPU: docs/PROMPT_POOL.md), else float32. The answers are then the target's own
    greedy decoding in that dtype."""
    if requested != "auto":
        return requested
    if device is not None and str(device).startswith("cuda"):
        return "bfloat16"
    if device is None:
        import torch

        if torch.cuda.is_available():
            return "bfloat16"
    return "bfloat16" if native_bf16() else "float32"


@dataclass(frozen=True)
class KernelChoice:
    """How the target computes: its weights' dtype and its linear layers (`target.load.LINEAR_KINDS`)."""

    dtype: str  # "float32" | "bfloat16"
    linear: str = "torch"  # "torch" | "pretransposed" | "onednn" | "rowdot" | "amx"

    @property
    def name(self) -> str:
        return f"{self.dtype}/{self.linear}"

    @classmethod
    def parse(cls, name: str) -> "KernelChoice":
        dtype, _, linear = name.partition("/")
        return cls(dtype, linear or "torch")


@dataclass
class CostCurve:
    """Measured cost of one target pass over T new tokens with `kernel` (attention: batch-invariant)."""

    kernel: str  # KernelChoice.name
    tokens: list[int]  # T values
    ms: list[float]  # median ms of one pass over T tokens, same order
    min_rows: int  # row padding of the linear layers that made every row invariant (17+ = none found)
    invariant: bool | None = None  # did chain and tree passes match single steps bitwise (None: not checked)
    context: int = 256  # tokens already in the cache while measuring
    measured_at: str = ""  # ISO time
    beside: list[str] = field(default_factory=list)  # the kernels measured interleaved with it ([]: alone)

    def at(self, T: int) -> float:
        """ms of a pass over T tokens (the nearest measured T at or above, else the largest)."""
        for t, v in zip(self.tokens, self.ms):
            if t >= T:
                return v
        return self.ms[-1]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def kernels_digest() -> str:
    """The build of every compiled kernel this process may run (rowdot and the attention, the AMX product, the
    AVX512-BF16 product): what a cost curve or a bench record was measured with."""
    from specwire.target import amx, bf16dot, rowdot

    return f"{rowdot.source_digest()}+{amx.source_digest()}+{bf16dot.source_digest()}"


@dataclass
class CacheKey:
    """Everything a cost curve depends on."""

    cpu: str
    features: dict[str, bool]
    threads: int
    torch: str
    device: str
    target: str  # target fingerprint
    kernels: str = ""  # `kernels_digest()`: a changed compiled kernel makes every cached curve stale
    format: int = CACHE_FORMAT
    extra: dict = field(default_factory=dict)

    @classmethod
    def here(cls, target_fingerprint: str, device: str = "cpu") -> "CacheKey":
        return cls(cpu=cpu_model(), features=cpu_features(), threads=torch.get_num_threads(), torch=torch.__version__,
                   device=str(device), target=target_fingerprint, kernels=kernels_digest())

    def to_dict(self) -> dict:
        return asdict(self)

    def path(self, home: Path) -> Path:
        return home / "hardware" / f"{self.target}-{short_hash(json.dumps(self.to_dict(), sort_keys=True))}.json"


@dataclass
class HardwareCache:
    """What is cached for one key: cost curves, and the linear row padding, per kernel name."""

    curves: dict[str, CostCurve] = field(default_factory=dict)
    min_rows: dict[str, dict[str, int]] = field(default_factory=dict)  # kernel -> product key -> row padding


def read_cache(key: CacheKey, home: Path) -> HardwareCache:
    """What is cached for exactly `key` (empty when nothing is, or when the file is foreign or unreadable)."""
    path = key.path(home)
    if not path.is_file():
        return HardwareCache()
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key.to_dict():
            log.warning("ignoring cost cache %s: it was measured under another key (%s); measuring again",
                        path, _diff(data.get("key"), key.to_dict()))
            return HardwareCache()
        return HardwareCache(curves={n: CostCurve.from_dict(c) for n, c in data.get("curves", {}).items()},
                             min_rows={n: {k: int(v) for k, v in r.items()} for n, r in data.get("min_rows", {}).items()})
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("ignoring unreadable cost cache %s (%s)", path, e)
        return HardwareCache()


def write_cache(key: CacheKey, home: Path, *, curves: dict[str, CostCurve] | None = None,
                min_rows: dict[str, dict[str, int]] | None = None) -> Path:
    """Merge curves and row paddings into the cache file of `key` (atomically)."""
    old = read_cache(key, home)
    data = {"key": key.to_dict(),
            "curves": {n: c.to_dict() for n, c in (old.curves | (curves or {})).items()},
            "min_rows": old.min_rows | (min_rows or {})}
    path = key.path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, data)
    return path


def _diff(found, expected: dict) -> str:
    if not isinstance(found, dict):
        return "no key recorded"
    names = sorted(k for k in expected if found.get(k) != expected[k])
    return ", ".join(f"{k}: {found.get(k)!r}" for k in names) or "same"


def memory_available(device: str = "cpu") -> int | None:
    """Bytes of memory `device` can still give: a GPU's free memory, or on CPU what the machine can give without
    swapping (Linux's MemAvailable); None where it does not say."""
    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def loaded_bytes(model: torch.nn.Module) -> int:
    """Bytes held by a loaded model's tensors: parameters, buffers and what its modules keep beside them (the
    compact weight forms and packed copies of `target.fastlinear`), each storage counted once."""
    from specwire.target.compact import CompactWeight

    seen, total = set(), 0
    for module in model.modules():
        held = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        for value in vars(module).values():
            if isinstance(value, CompactWeight):
                held += [t for t in (value.codes, value.d, value.m) if t is not None]
            elif isinstance(value, torch.Tensor):
                held.append(value)
        for t in held:
            try:
                where, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):  # an opaque layout (oneDNN's packed weights)
                where, size = id(t), t.numel() * t.element_size()
            if where not in seen:
                seen.add(where)
                total += size
    return total


# ---- measuring ----------------------------------------------------------------------------------------

@torch.inference_mode()
def measure_pass_ms(model, tokens, *, context: int = 256, reps: int = 5, vocab: int | None = None) -> list[float]:
    """Median wall time (ms) of one forward over T new tokens after `context` cached ones, for each T in `tokens`,
    as decoding runs it (`target.passes.padded_pass`, into `target.kvcache`'s cache)."""
    return measure_passes_ms([model], tokens, context=context, reps=reps, vocab=vocab)[0]


@torch.inference_mode()
def measure_passes_ms(models, tokens, *, context: int = 256, reps: int = 5,
                      vocab: int | None = None) -> list[list[float]]:
    """`measure_pass_ms` for several loaded models of one target at once (one list of ms per model, in order),
    timed side by side.

    The sizes and the models are interleaved (every repetition times each T once on every model in turn, after
    two warm-up rounds), so that a burst of load on a shared machine spreads over all sizes and all models
    instead of bending one: two kernels measured apart, minutes apart, can trade places under a passing load,
    two measured together cannot. Every model decodes the same tokens; its cache is cropped back after every
    pass.
    """
    from specwire.target.kvcache import decoding_cache
    from specwire.target.passes import padded_pass, pass_rows

    vocab = vocab or models[0].config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, context), generator=g)
    xs = {T: torch.randint(0, vocab, (1, T), generator=g) for T in tokens}
    runs = []  # (model, its device, its cache, its row padding)
    for model in models:
        dev = next(model.parameters()).device
        cache = decoding_cache(model, context + max(tokens))
        model(ctx.to(dev), past_key_values=cache, use_cache=True, logits_to_keep=1)
        runs.append((model, dev, cache, pass_rows(model, cache)))
    times = [{T: [] for T in tokens} for _ in models]
    for r in range(reps + 2):
        for T in tokens:
            for i, (model, dev, cache, rows) in enumerate(runs):
                x = xs[T].to(dev)
                t0 = time.perf_counter()
                padded_pass(model, x, cache, rows, logits_to_keep=T)
                synchronize(dev)
                if r >= 2:
                    times[i][T].append(time.perf_counter() - t0)
                cache.crop(context)
    return [[1000 * statistics.median(t[T]) for T in tokens] for t in times]


def measure_curve(target, kernel: KernelChoice, *, min_rows: int, tokens=PASS_TOKENS, context: int = 256,
                  reps: int = 5) -> CostCurve:
    """The cost curve of an already loaded `target` (which runs `kernel`)."""
    return measure_curves([target], [kernel], min_rows=[min_rows], tokens=tokens, context=context, reps=reps)[0]


def measure_curves(targets, kernels: list[KernelChoice], *, min_rows: list[int], tokens=PASS_TOKENS,
                   context: int = 256, reps: int = 5) -> list[CostCurve]:
    """The cost curves of several loaded copies of one target (`targets[i]` runs `kernels[i]`), measured side by
    side (`measure_passes_ms`); each curve names the others in `beside`."""
    ms = measure_passes_ms([t.model for t in targets], list(tokens), context=context, reps=reps,
                           vocab=targets[0].info.vocab_size)
    at = time.strftime("%Y-%m-%dT%H:%M:%S")
    names = [k.name for k in kernels]
    return [CostCurve(kernel=k.name, tokens=list(tokens), ms=[round(v, 3) for v in m], min_rows=r, context=context,
                      measured_at=at, beside=[n for n in names if n != k.name])
            for k, m, r in zip(kernels, ms, min_rows)]

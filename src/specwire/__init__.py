"""specwire: EAGLE-3 speculative decoding with a wiring contract that travels with the weights.

The public API, one name per stage (each loads its package on first use, so `import specwire` is cheap):

    load_target(name_or_path)            a target: the built-in "smollm2-135m" or any HF causal-LM folder
    load_draft(path_or_name)             a draft checkpoint (native, SGLang or speculators layout), checked
    speculative_generate(target, draft, prompt_ids, ...)   lossless chain or tree decoding
    train(TrainConfig(...))              EAGLE-3 training with training-time test
    evaluate(draft, dump_dir)            offline per-step accuracy and the accept length it predicts
    diagnose(DoctorConfig(...))          the doctor: wiring, format and flag findings, and the wiring search
    Wiring                               the contract record every dump, checkpoint and engine carries

Packages, in import order (each imports only from those before it; `docs/ARCHITECTURE.md`):
wiring/errors/safeio -> target -> draft -> data -> training -> decode -> interop -> doctor -> bench
-> server -> cli.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "load_target": "specwire.target.load",
    "Target": "specwire.target.load",
    "load_draft": "specwire.draft.checkpoint",
    "Eagle3Draft": "specwire.draft.model",
    "speculative_generate": "specwire.decode.engine",
    "SpecConfig": "specwire.decode.engine",
    "train": "specwire.training.trainer",
    "TrainConfig": "specwire.training.config",
    "evaluate": "specwire.training.evaluate",
    "diagnose": "specwire.doctor.diagnose",
    "DoctorConfig": "specwire.doctor.diagnose",
    "Wiring": "specwire.wiring",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'specwire' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))

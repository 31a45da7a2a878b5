"""`ServeConfig`: the settings of `specwire serve` (address, API model name, admission and time limits).

Owns the settings and their validation only; the `serve` flags are generated from this dataclass
(`specwire.cli.serve`). Does not own the speculation knobs (`decode.engine.SpecConfig`) or what the
limits do (`server.admission`, `server.run`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from specwire.errors import SpecwireError


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"  # bind address; the server has no authentication, so bind others only on a trusted network
    port: int = 8000  # TCP port
    model_name: str | None = None  # model id in the API (default: the target's name)
    max_queue: int = 16  # requests allowed to wait for the decoder; past it new ones get 429 with Retry-After
    request_timeout: float = 600.0  # seconds a request may take, queueing included, before it ends with an error (0 = no limit)
    shutdown_timeout: float = 20.0  # seconds SIGTERM lets in-flight requests finish before cancelling them

    def __post_init__(self):
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise SpecwireError(f"port (--port): expected 1-65535, found {self.port!r}; pick a free port such as 8000.")
        if not isinstance(self.max_queue, int) or isinstance(self.max_queue, bool) or self.max_queue < 0:
            raise SpecwireError(f"max_queue (--max-queue): expected an integer >= 0, found {self.max_queue!r}.")
        for name in ("request_timeout", "shutdown_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                flag = "--" + name.replace("_", "-")
                raise SpecwireError(f"{name} ({flag}): expected a number of seconds >= 0, found {v!r}.")

    def to_dict(self) -> dict:
        return asdict(self)

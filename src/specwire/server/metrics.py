"""Server-wide metrics of `specwire serve` and their Prometheus text exposition.

Owns: `ServerMetrics` (thread-safe counters: requests, tokens, speculation, errors and admission
rejections, updated by the worker thread and the event loop) and `render_prometheus` (a snapshot, plus
the admission queue's gauges, as Prometheus text 0.0.4). Does not own what is measured (`server.app`)
or the queue itself (`server.admission`).
"""

from __future__ import annotations

import threading


class ServerMetrics:
    """Server-wide counters, updated by the worker thread, read by /metrics (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}  # endpoint -> completed requests
        self.errors: dict[str, int] = {}  # error type -> count
        self.rejected: dict[str, int] = {}  # admission refusal reason (queue_full, shutting_down) -> count
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.verify_passes = 0  # speculative verification passes (prefill excluded)
        self.produced = 0  # tokens produced by those passes (accept length numerator)
        self.accept_counts: list[int] = []  # per draft position, summed over requests
        self.reach_counts: list[int] = []
        self.copied = 0  # tokens copied from the context and verified (`decode.lookup`), summed over requests
        self.copied_accepted = 0  # of those, accepted beyond the draft's own
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.generation_s = 0.0
        self.last_tokens_per_s: float | None = None

    def record(self, endpoint: str, *, prompt_tokens: int, completion_tokens: int, seconds: float,
               extra: dict) -> None:
        with self._lock:
            self.requests[endpoint] = self.requests.get(endpoint, 0) + 1
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += completion_tokens
            self.generation_s += seconds
            self.last_tokens_per_s = completion_tokens / seconds if seconds > 0 else None
            passes = extra.get("num_verify_passes")
            if passes and extra.get("accept_length") is not None:
                self.verify_passes += passes
                self.produced += round(extra["accept_length"] * passes)
            for name in ("accept_counts", "reach_counts"):
                acc, new = getattr(self, name), extra.get(name) or []
                acc.extend([0] * (len(new) - len(acc)))
                for k, v in enumerate(new):
                    acc[k] += v
            copies = extra.get("lookup") or {}
            self.copied += copies.get("tokens", 0)
            self.copied_accepted += copies.get("accepted", 0)
            self.draft_s += extra.get("draft_s", 0.0)
            self.verify_s += extra.get("verify_s", 0.0)

    def record_error(self, type_: str) -> None:
        with self._lock:
            self.errors[type_] = self.errors.get(type_, 0) + 1

    def record_rejection(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests": dict(self.requests), "errors": dict(self.errors), "rejected": dict(self.rejected), "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens, "verify_passes": self.verify_passes,
                "accept_length": self.produced / self.verify_passes if self.verify_passes else None,
                "accept_per_position": [a / r if r else 0.0 for a, r in zip(self.accept_counts, self.reach_counts)],
                "copied_tokens": self.copied, "copied_accepted": self.copied_accepted,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "generation_s": self.generation_s,
                "last_tokens_per_s": self.last_tokens_per_s,
            }


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(snap: dict, *, model_name: str, mode: str, queue: dict | None = None,
                      info: dict[str, str] | None = None) -> str:
    """Prometheus text exposition (version 0.0.4) of a `ServerMetrics.snapshot()`.

    queue: `Admission.snapshot()` (waiting, running, capacity, draining), rendered as gauges.
    """
    lines: list[str] = []

    def metric(name, kind, help_, samples):
        lines.append(f"# HELP specwire_{name} {help_}")
        lines.append(f"# TYPE specwire_{name} {kind}")
        for labels, value in samples:
            lab = "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}" if labels else ""
            lines.append(f"specwire_{name}{lab} {value!r}")

    metric("info", "gauge", "Served model, decoding mode, dtype and speculation budget.",
           [({"model": model_name, "mode": mode, **(info or {})}, 1)])
    req = snap["requests"] or {"completions": 0, "chat_completions": 0}
    metric("requests_total", "counter", "Completed generation requests.",
           [({"endpoint": e}, n) for e, n in sorted(req.items())])
    metric("request_errors_total", "counter", "Requests refused or failed, by error type.",
           [({"type": t}, n) for t, n in sorted(snap["errors"].items())])
    rejected = snap.get("rejected") or {"queue_full": 0}
    metric("rejected_requests_total", "counter", "Requests refused at admission (429 queue full, 503 shutting down).",
           [({"reason": r}, n) for r, n in sorted(rejected.items())])
    if queue is not None:
        metric("queue_depth", "gauge", "Admitted requests waiting for the decoder.", [({}, queue["waiting"])])
        metric("requests_running", "gauge", "Requests being decoded now (0 or 1).", [({}, queue["running"])])
        metric("queue_capacity", "gauge", "Requests allowed to wait (--max-queue); past it new ones get 429.",
               [({}, queue["max_queue"])])
        metric("draining", "gauge", "1 while shutting down (new requests get 503).", [({}, int(queue["draining"]))])
    metric("prompt_tokens_total", "counter", "Prompt tokens of completed requests.", [({}, snap["prompt_tokens"])])
    metric("generated_tokens_total", "counter", "Tokens generated for completed requests.",
           [({}, snap["generated_tokens"])])
    metric("verify_passes_total", "counter", "Speculative verification passes of the target (prefill excluded).",
           [({}, snap["verify_passes"])])
    if snap["accept_length"] is not None:
        metric("accept_length_mean", "gauge", "Tokens produced per verification pass, over all requests.",
               [({}, float(snap["accept_length"]))])
    if snap["accept_per_position"]:
        metric("accept_rate", "gauge", "Acceptance rate per draft position, among passes reaching it.",
               [({"position": str(k)}, float(v)) for k, v in enumerate(snap["accept_per_position"])])
    metric("copied_tokens_total", "counter", "Tokens copied from the context and verified beside the draft's.",
           [({}, snap["copied_tokens"])])
    metric("copied_tokens_accepted_total", "counter", "Copied tokens the target accepted beyond the draft's own.",
           [({}, snap["copied_accepted"])])
    if snap["last_tokens_per_s"] is not None:
        metric("last_request_tokens_per_second", "gauge", "Generated tokens per second of the last request.",
               [({}, float(snap["last_tokens_per_s"]))])
    metric("draft_seconds_total", "counter", "Seconds spent in the draft.", [({}, float(snap["draft_s"]))])
    metric("verify_seconds_total", "counter", "Seconds spent in target passes and verification.",
           [({}, float(snap["verify_s"]))])
    metric("generation_seconds_total", "counter", "Seconds spent generating.", [({}, float(snap["generation_s"]))])
    return "\n".join(lines) + "\n"

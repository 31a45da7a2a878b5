"""Bounded admission for `specwire serve`: who may wait for the decoder, for how long, and when to back off.

Owns: `Admission` (one decoder slot plus at most `max_queue` waiting requests; past that a 429 with a
Retry-After estimate; while draining for shutdown a 503), `Ticket` (one admitted request's slot, its
deadline and its cancellation, shared by the event loop and the worker thread) and the error each
cancellation reason turns into. Thread-safe, framework-free. Does not own the HTTP app, decoding or
signal handling (`server.app`, `server.run`).

A slot is held from admission until the worker thread is done with the request, not until the client
has its answer: a request cancelled while queued (timeout, disconnect, shutdown) keeps its slot until
the worker reaches it and drops it, so the queue depth always says how much work is ahead.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from typing import Callable

from specwire.server.protocol import RequestError

CANCEL_REASONS = ("timeout", "disconnected", "shutdown")
RETRY_AFTER_MAX_S = 60  # the Retry-After estimate is capped here
SERVICE_WINDOW = 8  # recent decoding times the Retry-After estimate is the median of


def cancel_error(reason: str, *, timeout_s: float | None = None) -> RequestError:
    """The OpenAI-style error a request cancelled for `reason` ends with."""
    if reason == "timeout":
        return RequestError(f"the request did not finish within the server's time limit of {timeout_s:g} s "
                            "(--request-timeout), queueing included; retry later or ask for fewer tokens.",
                            status=408, type_="timeout_error", code="request_timeout")
    if reason == "shutdown":
        return shutting_down_error()
    return RequestError("the request was cancelled (the client disconnected).", status=499, type_="cancelled",
                        code="client_disconnected")


def shutting_down_error() -> RequestError:
    return RequestError("the server is shutting down and takes no new requests; retry against another instance "
                        "or after it restarts.", status=503, type_="server_unavailable", code="shutting_down",
                        headers={"Retry-After": "5"})


class Ticket:
    """One admitted request: its deadline, its cancellation and its slot (released exactly once)."""

    def __init__(self, admission: "Admission", deadline: float | None):
        self._admission = admission
        self.deadline = deadline  # time.monotonic() value, None = no limit
        self.reason: str | None = None  # why it was cancelled (one of CANCEL_REASONS), None while not
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []
        self._started = self._released = False

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative); None without a limit."""
        return None if self.deadline is None else max(0.0, self.deadline - self._admission.clock())

    def expired(self) -> bool:
        return self.deadline is not None and self._admission.clock() >= self.deadline

    def on_cancel(self, fn: Callable[[str], None]) -> None:
        """Call fn(reason) on cancellation (at once when already cancelled). fn may run on any thread."""
        with self._lock:
            if self.reason is None:
                self._listeners.append(fn)
                return
            reason = self.reason
        fn(reason)

    def cancel(self, reason: str) -> bool:
        """Cancel for `reason` (the first reason wins); True when this call cancelled it."""
        if reason not in CANCEL_REASONS:
            raise ValueError(f"unknown cancel reason {reason!r}")
        with self._lock:
            if self.reason is not None or self._released:
                return False
            self.reason = reason
            listeners, self._listeners = self._listeners, []
        for fn in listeners:
            fn(reason)
        return True

    def start(self) -> None:
        """The worker thread took the request (it stops waiting)."""
        with self._lock:
            if self._started or self._released:
                return
            self._started = True
        self._admission._on_start()

    def release(self, service_s: float | None = None) -> None:
        """The worker thread is done with the request; service_s: decoding seconds (feeds Retry-After)."""
        with self._lock:
            if self._released:
                return
            self._released = True
            started = self._started
            self._listeners = []
        self._admission._on_release(self, started, service_s)


class Admission:
    """One decoder slot plus at most `max_queue` waiting requests; the rest are told when to come back.

    request_timeout: seconds from admission to the end of the answer (0 = no limit).
    """

    def __init__(self, max_queue: int, request_timeout: float = 0.0, *, clock: Callable[[], float] = time.monotonic):
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        self.clock = clock
        self._lock = threading.Lock()
        self._tickets: set[Ticket] = set()  # admitted, not released
        self._running = 0
        self._draining = False
        self._service_s: deque[float] = deque(maxlen=SERVICE_WINDOW)  # decoding seconds of the last requests

    # -- admission ---------------------------------------------------------------------------------------

    def admit(self) -> Ticket:
        """A slot, or a `RequestError`: 429 (queue full, with Retry-After) or 503 (shutting down)."""
        with self._lock:
            if self._draining:
                raise shutting_down_error()
            if len(self._tickets) >= self.max_queue + 1:
                retry = self._retry_after()
                raise RequestError(f"the server is busy: {len(self._tickets) - self._running} request(s) are "
                                   f"waiting, the most it queues (--max-queue {self.max_queue}); retry after "
                                   f"{retry} s.", status=429, type_="rate_limit_error", code="queue_full",
                                   headers={"Retry-After": str(retry)})
            deadline = self.clock() + self.request_timeout if self.request_timeout > 0 else None
            ticket = Ticket(self, deadline)
            self._tickets.add(ticket)
            return ticket

    def _retry_after(self) -> int:
        """Whole seconds until a slot is likely free: about one request's decoding time, the median of the
        last SERVICE_WINDOW (robust to a slow first request); 1 when unknown."""
        est = statistics.median(self._service_s) if self._service_s else 1.0
        return int(min(RETRY_AFTER_MAX_S, max(1, math.ceil(est))))

    def _on_start(self) -> None:
        with self._lock:
            self._running += 1

    def _on_release(self, ticket: Ticket, started: bool, service_s: float | None) -> None:
        with self._lock:
            self._tickets.discard(ticket)
            if started:
                self._running -= 1
            if service_s is not None and ticket.reason is None:
                self._service_s.append(service_s)

    # -- shutdown ------------------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop admitting: every new request gets 503 from now on."""
        with self._lock:
            self._draining = True

    def cancel_all(self, reason: str = "shutdown") -> int:
        """Cancel every admitted request; returns how many were still uncancelled."""
        with self._lock:
            tickets = list(self._tickets)
        return sum(t.cancel(reason) for t in tickets)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def active(self) -> int:
        """Admitted requests the worker is not done with (running + waiting)."""
        with self._lock:
            return len(self._tickets)

    def snapshot(self) -> dict:
        with self._lock:
            return {"waiting": len(self._tickets) - self._running, "running": self._running,
                    "max_queue": self.max_queue, "draining": self._draining, "retry_after_s": self._retry_after()}

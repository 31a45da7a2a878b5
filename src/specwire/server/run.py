"""Running the `specwire serve` app under uvicorn, with a graceful shutdown on SIGTERM or Ctrl-C.

Owns: `serve` (the uvicorn loop for an app made by `create_app`) and the shutdown sequence. On the
first SIGTERM/SIGINT the server stops admitting (new generation requests get 503 with Retry-After,
/health says "draining") but keeps its socket open; in-flight requests get `shutdown_timeout` seconds
to finish, then the rest are cancelled (a non-streamed request gets a 503 error body, a stream a final
error event) and the process exits with status 0. A second signal cancels at once. Does not own the
app, the admission queue or the command line (`server.app`, `server.admission`, `specwire.cli.serve`).
"""

from __future__ import annotations

import logging
import time

from specwire.errors import SpecwireError
from specwire.server.config import ServeConfig

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 5.0  # after cancelling, how long cancelled requests get to send their error before exit


def _graceful_server_class():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn.Server whose exit signals drain the admission queue instead of closing the socket."""

        def __init__(self, config, admission, shutdown_timeout: float):
            super().__init__(config)
            self.admission, self.shutdown_timeout = admission, shutdown_timeout
            self.signals = 0  # exit signals received (set in the signal handler: plain assignments only)
            self.drain_since: float | None = None
            self.cancelled_at: float | None = None

        def handle_exit(self, sig, frame) -> None:
            # A signal handler runs between bytecodes of the main thread, which may hold the admission
            # lock: only plain assignments here, the work happens in on_tick. The signal is not recorded
            # in _captured_signals, so uvicorn does not re-raise it after serving (the exit status stays 0).
            self.signals += 1

        async def on_tick(self, counter: int) -> bool:
            now = time.monotonic()
            if self.signals and self.drain_since is None:
                self.drain_since = now
                self.admission.begin_drain()
                log.warning("specwire serve: shutting down; %d request(s) in flight get %.0f s to finish "
                            "(new requests get 503)", self.admission.active, self.shutdown_timeout)
            if self.drain_since is not None and not self.should_exit:
                if self.admission.active == 0:
                    self.should_exit = True
                elif self.cancelled_at is None and (self.signals > 1 or now - self.drain_since >= self.shutdown_timeout):
                    n = self.admission.cancel_all("shutdown")
                    self.cancelled_at = now
                    log.warning("specwire serve: cancelled %d request(s) still in flight", n)
                elif self.cancelled_at is not None and now - self.cancelled_at >= CANCEL_GRACE_S:
                    self.should_exit = True
            return await super().on_tick(counter)

    return GracefulServer


def make_server(app, config: ServeConfig, *, log_level: str = "warning"):
    """The uvicorn server (with the graceful shutdown) for `app`; `.run()` serves until an exit signal.

    Tests run it in a thread and call `.handle_exit(signal.SIGTERM, None)` to play a SIGTERM.
    """
    import uvicorn

    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                               timeout_graceful_shutdown=int(CANCEL_GRACE_S))
    return _graceful_server_class()(uv_config, app.state.admission, config.shutdown_timeout)


def serve(app, config: ServeConfig, *, log_level: str = "warning") -> int:
    """Serve `app` (from `create_app`) on config.host:config.port until SIGTERM/SIGINT; returns 0.

    Raises SpecwireError when the address cannot be bound.
    """
    server = make_server(app, config, log_level=log_level)
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits 1 when it cannot bind (it logged why)
        if e.code:
            raise SpecwireError(f"could not serve on {config.host}:{config.port} (see the message above; is the "
                                "port in use? pick another with --port).") from None
    return 0

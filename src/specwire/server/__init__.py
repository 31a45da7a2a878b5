"""`specwire serve`: a local OpenAI-compatible HTTP server over the speculative engine.

A server that degrades, never breaks: every malformed request gets a 400 with an OpenAI error body,
a full queue a 429 with Retry-After, a request past its time limit a clear error, and SIGTERM a
graceful drain ending with exit status 0.

Modules: `protocol` (request bodies -> `GenRequest`, OpenAI error bodies), `admission` (bounded queue,
deadlines, cancellation), `metrics` (counters, Prometheus text), `config` (`ServeConfig`), `app`
(`create_app`: the FastAPI routes and the decoding worker), `run` (`serve`: uvicorn with the graceful
shutdown). The command line lives in `specwire.cli.serve`; this package never imports `specwire.cli`.
"""

from specwire.server.admission import Admission, Ticket
from specwire.server.app import create_app
from specwire.server.config import ServeConfig
from specwire.server.metrics import ServerMetrics, render_prometheus
from specwire.server.protocol import GenRequest, RequestError, decode_body, error_body, parse_request
from specwire.server.run import make_server, serve

__all__ = ["Admission", "GenRequest", "RequestError", "ServeConfig", "ServerMetrics", "Ticket", "create_app",
           "decode_body", "error_body", "parse_request", "make_server", "render_prometheus", "serve"]

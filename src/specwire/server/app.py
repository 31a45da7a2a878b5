"""The FastAPI app of `specwire serve`: OpenAI-compatible endpoints over the speculative engine.

Owns: `create_app` (the routes, the single decoding worker thread, the bridge from the engine's
`on_token` callback to JSON and server-sent-event responses, per-request time limits and client
disconnects). Does not own request validation (`server.protocol`), the queue bound and its 429/503
answers (`server.admission`), metrics (`server.metrics`), the uvicorn loop and SIGTERM (`server.run`),
decoding (`decode.engine`, `decode.plain`) or detokenization (`decode.text`).

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with `stream`), GET /v1/models,
GET /health, GET /metrics.

Concurrency: one request decodes at a time. The engine runs batch 1 on one KV cache, so requests go
through a single worker thread in arrival order; at most `max_queue` wait behind the one decoding, the
rest get 429 with Retry-After. Each request owns a `Ticket` (deadline, cancellation); the worker checks
it at every token, and the event loop waits on the request's event queue no longer than the deadline,
so a request that runs out of time gets its error at the deadline even while it is still queued.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Callable

from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

from specwire.errors import SpecwireError
from specwire.server.admission import Admission, Ticket, cancel_error, shutting_down_error
from specwire.server.config import ServeConfig
from specwire.server.metrics import ServerMetrics, render_prometheus
from specwire.server.protocol import (
    MAX_BODY_BYTES, GenRequest, RequestError, decode_body, error_body, parse_request, sse,
)

log = logging.getLogger(__name__)

# what an aborted generation is counted as in request_errors_total, by cancel reason
_ABORT_TYPES = {"timeout": "timeout", "disconnected": "cancelled", "shutdown": "shutdown"}


class _Abort(Exception):
    """Raised from on_token to end a generation early (stop string hit, request cancelled)."""


@dataclass
class Outcome:
    """What one request produced."""

    text: str
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    seconds: float
    seed: int
    extra: dict  # engine metrics (empty for plain decoding or a stop-string ending)


class _Job:
    """The event channel of one admitted request: worker thread -> event loop (text, done, error, cancelled)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ticket: Ticket):
        self.loop, self.ticket = loop, ticket
        self.queue: asyncio.Queue = asyncio.Queue()
        ticket.on_cancel(lambda reason: self.post(("cancelled", reason)))

    def post(self, item: tuple) -> None:
        """Thread-safe put; a closed loop (server gone) means nobody is listening."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass

    async def next(self) -> tuple:
        """The next event, or ("cancelled", "timeout") once the request's deadline passes."""
        try:
            return await asyncio.wait_for(self.queue.get(), self.ticket.remaining())
        except asyncio.TimeoutError:
            if self.ticket.cancel("timeout") or self.ticket.cancelled:
                return ("cancelled", self.ticket.reason)
            return await self.queue.get()  # the worker just finished: its last event is on the way


async def _read_body(request: Request) -> bytes:
    """The raw body, at most MAX_BODY_BYTES: past it a 413, after reading (and dropping) up to
    4 x MAX_BODY_BYTES, so that a client still sending gets the answer instead of a reset connection."""
    from starlette.requests import ClientDisconnect

    size = request.headers.get("content-length", "")
    chunks, n = [], 0
    too_big = size.isdigit() and int(size) > MAX_BODY_BYTES
    try:
        async for chunk in request.stream():
            n += len(chunk)
            too_big = too_big or n > MAX_BODY_BYTES
            if too_big and n > 4 * MAX_BODY_BYTES:
                break
            if not too_big:
                chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError("the client disconnected while sending the body.") from None
    if too_big:
        raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes.", status=413,
                           code="body_too_large")
    return b"".join(chunks)


async def _watch_disconnect(request: Request, ticket: Ticket) -> None:
    """Cancel `ticket` when the client of a non-streamed request goes away (its slot is freed sooner)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a server closing down; nothing to cancel for
        return
    ticket.cancel("disconnected")


def create_app(target, draft=None, *, spec=None, model_name: str | None = None, config: ServeConfig | None = None):
    """The FastAPI app serving `target`, speculatively with `draft` (an engine draft) or plainly (None).

    spec: `engine.SpecConfig` (its `tree` picks tree or chain drafting); model_name: the name in
    /v1/models and the responses (default: `config.model_name`, else the target's name); config: the
    admission and time limits (`ServeConfig`; its host/port are not used here). The app's state holds
    `metrics`, `admission` and `config`.
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from specwire.decode.plain import plain_generate
    from specwire.decode.sampling import SamplingParams, make_generator
    from specwire.decode.text import TextStream

    if draft is not None:
        from specwire.decode.engine import SpecConfig, speculative_generate

        spec = spec or SpecConfig()
        mode = "tree" if spec.tree else "chain"
    else:
        mode = "plain"
    config = config or ServeConfig()
    served = {"dtype": str(target.dtype).replace("torch.", ""), "budget": spec.budget if draft is not None else "none"}
    model_name = model_name or config.model_name or target.info.name
    context = target.info.max_position_embeddings
    metrics = ServerMetrics()
    admission = Admission(config.max_queue, config.request_timeout)
    created = int(time.time())
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specwire-serve")

    def run(req: GenRequest, on_text: Callable[[str], None] | None, ticket: Ticket) -> Outcome:
        """Decode one request (worker thread). on_text gets each newly released piece of text."""
        seed = req.seed if req.seed is not None else secrets.randbits(32)
        params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
        gen = make_generator(seed, target.device)
        stream = TextStream.for_tokenizer(target.tokenizer, req.stop)
        t0 = time.perf_counter()

        def on_token(tok: int) -> None:
            piece = stream.add(tok)
            if piece and on_text:
                on_text(piece)
            if ticket.expired():
                ticket.cancel("timeout")
            if stream.stopped or ticket.cancelled:
                raise _Abort()

        extra: dict = {}
        try:
            if draft is not None:
                res = speculative_generate(target, draft, req.prompt_ids, max_new_tokens=req.max_tokens, params=params,
                                           generator=gen, spec=spec, tree=spec.tree, on_token=on_token)
                extra = res.extra
            else:
                res = plain_generate(target, req.prompt_ids, max_new_tokens=req.max_tokens, params=params,
                                     generator=gen, on_token=on_token)
            finish = "stop" if res.stop_reason == "eos" else "length"
        except _Abort:
            if not stream.stopped:
                raise
            finish = "stop"
        seconds = time.perf_counter() - t0
        rest = stream.finish()
        if rest and on_text:
            on_text(rest)
        return Outcome(stream.text, len(stream.ids), finish, seconds, seed, extra)

    def work(req: GenRequest, job: _Job, on_text: Callable[[str], None] | None) -> None:
        """The worker thread's whole handling of one request; never raises (the outcome goes to `job`)."""
        ticket = job.ticket
        ticket.start()
        service = None
        try:
            if ticket.expired():
                ticket.cancel("timeout")
            if ticket.cancelled:
                raise _Abort()
            out = run(req, on_text, ticket)
            service = out.seconds
            job.post(("done", out))
        except _Abort:
            metrics.record_error(_ABORT_TYPES.get(ticket.reason, "cancelled"))
        except BaseException as e:  # noqa: BLE001 - reported to the client as a 500, logged
            job.post(("error", e))
        finally:
            ticket.release(service)

    def usage(req: GenRequest, out: Outcome) -> dict:
        return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": out.completion_tokens,
                "total_tokens": len(req.prompt_ids) + out.completion_tokens}

    def extension(out: Outcome) -> dict:
        x = out.extra
        return {
            "mode": mode, "seed": out.seed, "seconds": out.seconds,
            "tokens_per_s": out.completion_tokens / out.seconds if out.seconds > 0 else None,
            "accept_length": x.get("accept_length"), "accept_per_position": x.get("accept_per_position"),
            "num_verify_passes": x.get("num_verify_passes"), "tree": x.get("tree"),
            "tree_fallback": x.get("tree_fallback"),
        }

    def finished(endpoint: str, req: GenRequest, out: Outcome) -> None:
        metrics.record(endpoint, prompt_tokens=len(req.prompt_ids), completion_tokens=out.completion_tokens,
                       seconds=out.seconds, extra=out.extra)

    def error_response(e: BaseException, *, record: bool = True) -> JSONResponse:
        if isinstance(e, RequestError):
            if record:
                metrics.record_error(e.type_)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        if isinstance(e, SpecwireError):
            if record:
                metrics.record_error("invalid_request_error")
            return JSONResponse(error_body(str(e)), status_code=400)
        log.error("specwire serve: request failed", exc_info=e)
        metrics.record_error("server_error")
        return JSONResponse(error_body("internal server error (see the server log)", type_="server_error"),
                            status_code=500)

    def rejected(e: RequestError) -> JSONResponse:
        metrics.record_rejection(e.code or "rejected")
        return error_response(e, record=False)

    def cancelled_response(reason: str) -> JSONResponse:
        return error_response(cancel_error(reason, timeout_s=config.request_timeout), record=False)

    @asynccontextmanager
    async def lifespan(app):
        yield
        admission.begin_drain()
        admission.cancel_all("shutdown")
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="specwire", version="1", lifespan=lifespan,
                  description="OpenAI-compatible local server over specwire's speculative engine.")
    app.state.metrics, app.state.admission, app.state.config = metrics, admission, config

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return JSONResponse(error_body(str(exc.detail), type_="invalid_request_error" if exc.status_code < 500
                                       else "server_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected_error(request, exc):
        return error_response(exc)

    async def generate(request: Request, kind: str):
        if admission.draining:
            return rejected(shutting_down_error())
        try:
            body = decode_body(await _read_body(request))
            encode = (lambda p: target.tokenizer(p)["input_ids"]) if kind == "completion" else target.encode_chat
            req = parse_request(body, kind=kind, encode=encode, context=context, vocab_size=target.info.vocab_size,
                                model_name=model_name)
        except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI-style error, no traceback
            return error_response(e)
        try:
            ticket = admission.admit()
        except RequestError as e:
            return rejected(e)
        endpoint = "completions" if kind == "completion" else "chat_completions"
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        job = _Job(asyncio.get_running_loop(), ticket)
        if not req.stream:
            executor.submit(work, req, job, None)
            watcher = asyncio.create_task(_watch_disconnect(request, ticket))
            try:
                what, value = await job.next()
            except asyncio.CancelledError:
                ticket.cancel("disconnected")
                raise
            finally:
                watcher.cancel()
            if what == "cancelled":
                return cancelled_response(value)
            if what == "error":
                return error_response(value)
            out = value
            finished(endpoint, req, out)
            if kind == "completion":
                choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
                obj = "text_completion"
            else:
                choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                          "finish_reason": out.finish_reason}
                obj = "chat.completion"
            return JSONResponse({"id": rid, "object": obj, "created": now, "model": model_name, "choices": [choice],
                                 "usage": usage(req, out), "specwire": extension(out)})

        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"

        def chunk(delta: str | None, finish: str | None = None, *, first: bool = False) -> dict:
            if kind == "completion":
                ch = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            else:
                d = {"role": "assistant", "content": ""} if first else ({} if delta is None else {"content": delta})
                ch = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": obj, "created": now, "model": model_name, "choices": [ch]}

        # submitted now, not when the response starts: queue order is admission order, and the slot is
        # released by the worker even if the response never starts
        executor.submit(work, req, job, lambda piece: job.post(("text", piece)))

        async def events():
            ended = False  # the worker sent its last event (done or error)
            try:
                if kind == "chat":
                    yield sse(chunk(None, first=True))
                while True:
                    what, value = await job.next()
                    if what == "text":
                        yield sse(chunk(value))
                        continue
                    ended = what != "cancelled"
                    if what == "done":
                        out = value
                        finished(endpoint, req, out)
                        last = chunk(None, out.finish_reason)
                        last["specwire"] = extension(out)
                        yield sse(last)
                        if req.include_usage:
                            yield sse({"id": rid, "object": obj, "created": now, "model": model_name, "choices": [],
                                       "usage": usage(req, out)})
                    elif what == "error":
                        yield sse(json_body(error_response(value)))
                    elif value != "disconnected":  # a timeout or shutdown: a final error event
                        yield sse(json_body(cancelled_response(value)))
                    break
                yield "data: [DONE]\n\n"
            finally:
                if not ended:
                    ticket.cancel("disconnected")  # a client gone mid-stream stops its generation at the next token

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "specwire",
                "specwire": {"mode": mode, "target": target.info.name, "context": context}}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if admission.draining:
            return JSONResponse({"status": "draining", "model": model_name, "mode": mode}, status_code=503)
        return {"status": "ok", "model": model_name, "mode": mode}

    @app.get("/metrics")
    async def prometheus():
        text = render_prometheus(metrics.snapshot(), model_name=model_name, mode=mode, queue=admission.snapshot(),
                                 info=served)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def json_body(response: Any) -> Any:
    """The JSON object a JSONResponse carries (for sending an error as a stream event)."""
    return json.loads(response.body)

"""`specwire serve`: a local OpenAI-compatible HTTP server over the speculative engine.

Owns: the FastAPI app (`create_app`), request validation into `GenRequest` (OpenAI-style 400 errors),
text assembly with exact stop strings (`TextTracker`), SSE streaming, server-wide metrics
(`ServerMetrics`, Prometheus text) and the `serve` subcommand. Does not own decoding (`engine`,
`plain`), sampling maths (`sampling`) or tokenization (the target's tokenizer and chat template).

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with `stream`), GET /v1/models,
GET /health, GET /metrics.

Concurrency: one request decodes at a time. The engine runs batch 1 on one KV cache, so requests go
through a single worker thread in arrival order (later requests wait in its queue). Streaming bridges
the engine's `on_token` callback (worker thread) to the response (event loop) with an asyncio queue.
A client that disconnects mid-stream stops its generation at the next token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

from specwire.cli import add_draft_mode_option, add_model_options
from specwire.errors import SpecwireError

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 256  # chat default, capped by the context left after the prompt

# Fields accepted with their neutral value only (anything else is refused, not silently ignored).
_NEUTRAL = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (None, False),
            "echo": (False,), "best_of": (1,), "top_logprobs": (None, 0)}
_COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options",
                  "stop", "user"} | set(_NEUTRAL)
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt"}
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens"}
CHAT_ROLES = ("system", "user", "assistant")


class RequestError(SpecwireError):
    """A bad request: HTTP `status` with an OpenAI-style error naming the offending `param`."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# ---- request validation (pure) -------------------------------------------------------------------------

@dataclass
class GenRequest:
    """One validated generation request, endpoint-independent."""

    prompt_ids: list[int]  # tokens fed to the target (chat template applied for chat)
    max_tokens: int  # new tokens at most
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (an extension; OpenAI has no top_k)
    seed: int | None = None  # None: a fresh seed, reported back in the response
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage block
    stop: list[str] = field(default_factory=list)  # exact stop strings, not included in the output


def _number(body: dict, name: str, default, *, integer: bool = False):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or not math.isfinite(v):
        kind = "an integer" if integer else "a finite number"
        raise RequestError(f"'{name}': expected {kind}, found {type(v).__name__} {v!r}.", param=name)
    return v


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, found {type(body).__name__}.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unsupported field(s): {', '.join(unknown)}. This server accepts: "
                           f"{', '.join(sorted(allowed))}.", param=unknown[0])
    for name, ok in _NEUTRAL.items():
        if name in body and body[name] not in ok:
            raise RequestError(f"'{name}': only {ok[0]!r} is supported here, found {body[name]!r}.", param=name)


def parse_messages(messages: Any) -> list[dict]:
    """OpenAI chat messages -> [{role, content: str}]; content parts of type text are joined."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages': expected a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"'{where}': expected an object, found {type(m).__name__}.", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise RequestError(f"'{where}.role': expected one of {', '.join(CHAT_ROLES)}, found {role!r}.",
                               param="messages")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise RequestError(f"'{where}.content': only text parts {{type: 'text', text}} are supported.",
                                       param="messages")
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"'{where}.content': expected a string, found {type(content).__name__}.",
                               param="messages")
        out.append({"role": role, "content": content})
    return out


def parse_request(body: Any, *, kind: str, encode: Callable[[Any], list[int]], context: int | None,
                  vocab_size: int, model_name: str) -> GenRequest:
    """Validate an OpenAI request body of `kind` ('completion' or 'chat') into a `GenRequest`.

    encode: prompt string (completion) or message list (chat) -> token ids. context: the target's
    positions (None = unbounded); vocab_size bounds prompts given as token ids.
    Raises `RequestError` naming the field.
    """
    _check_fields(body, COMPLETION_FIELDS if kind == "completion" else CHAT_FIELDS)
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestError(f"model '{model}' is not served here; this server serves '{model_name}'.",
                           param="model", status=404, code="model_not_found")
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("'prompt': empty prompt; give at least one character.", param="prompt")
            prompt_ids = list(encode(prompt))
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            bad = [t for t in prompt if not 0 <= t < vocab_size]
            if bad:
                raise RequestError(f"'prompt': token id {bad[0]} is outside the vocabulary [0, {vocab_size}).",
                                   param="prompt")
            prompt_ids = list(prompt)  # token ids, as OpenAI accepts
        else:
            raise RequestError("'prompt': expected a non-empty string (or a list of token ids), found "
                               f"{type(prompt).__name__}.", param="prompt")
        default_max = DEFAULT_COMPLETION_MAX_TOKENS
    else:
        prompt_ids = list(encode(parse_messages(body.get("messages"))))
        default_max = DEFAULT_CHAT_MAX_TOKENS
    if not prompt_ids:
        raise RequestError("the prompt encodes to no tokens.", param="prompt" if kind == "completion" else "messages")

    room = None if context is None else context - len(prompt_ids)
    if room is not None and room < 1:
        raise RequestError(f"the prompt ({len(prompt_ids)} tokens) fills the model's context of {context} "
                           "positions; shorten it.", param="prompt" if kind == "completion" else "messages")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, None, integer=True)
    if max_tokens is None:
        max_tokens = default_max if room is None else min(default_max, room)
    elif max_tokens < 1:
        raise RequestError(f"'{name}': expected an integer >= 1, found {max_tokens}.", param=name)
    elif room is not None and max_tokens > room:
        raise RequestError(f"'{name}' {max_tokens} + prompt ({len(prompt_ids)} tokens) exceeds the model's context "
                           f"of {context} positions; use max_tokens <= {room}.", param=name)

    temperature = _number(body, "temperature", 0.0)
    top_p = _number(body, "top_p", 1.0)
    top_k = _number(body, "top_k", 0, integer=True)
    seed = _number(body, "seed", None, integer=True)
    if temperature < 0:
        raise RequestError(f"'temperature': expected a number >= 0 (0 = greedy), found {temperature}.",
                           param="temperature")
    if not 0 < top_p <= 1:
        raise RequestError(f"'top_p': expected a number in (0, 1], found {top_p}.", param="top_p")
    if top_k < 0:
        raise RequestError(f"'top_k': expected an integer >= 0 (0 = off), found {top_k}.", param="top_k")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream': expected true or false, found {stream!r}.", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise RequestError("'stream_options': expected {\"include_usage\": true|false}.", param="stream_options")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop': expected a non-empty string or a list of up to 4 non-empty strings.", param="stop")
    return GenRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                      top_k=top_k, seed=seed, stream=stream, include_usage=opts.get("include_usage", False), stop=stop)


# ---- text assembly with stop strings (pure over a decode function) ----------------------------------------

class TextTracker:
    """Turns generated token ids into released text, exactly as the final text will read.

    Text is the decode of all ids so far (special tokens skipped). A trailing replacement character (a
    multi-byte character cut in half) and the last len(longest stop)-1 characters (a stop string may be
    starting) are held back until more tokens arrive or `finish` is called. The first occurrence of a
    stop string ends the text there (the stop string is not included).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]):
        self.decode, self.stop = decode, list(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # decode of ids
        self.released = 0  # characters of text already handed out
        self.stopped = False  # a stop string was found

    def add(self, token_id: int) -> str:
        """Take one token; return the newly released text ('' if none). After a stop, returns the rest."""
        if self.stopped:
            raise RuntimeError("TextTracker.add after a stop string: the generation should have ended")
        self.ids.append(token_id)
        before = len(self.text)
        self.text = self.decode(self.ids)
        if self.stop:
            start = max(0, before - self.hold - 1)  # a trailing partial character may have changed
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
                return self._release(len(self.text))
        return self._release(len(self.text) - self.hold - self.text.endswith("\ufffd"))

    def finish(self) -> str:
        """Release everything left."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        if end <= self.released:
            return ""
        out = self.text[self.released:end]
        self.released = end
        return out


# ---- metrics ---------------------------------------------------------------------------------------------

class ServerMetrics:
    """Server-wide counters, updated by the worker thread, read by /metrics (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}  # endpoint -> completed requests
        self.errors: dict[str, int] = {}  # error type -> count
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.verify_passes = 0  # speculative verification passes (prefill excluded)
        self.produced = 0  # tokens produced by those passes (accept length numerator)
        self.accept_counts: list[int] = []  # per draft position, summed over requests
        self.reach_counts: list[int] = []
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
            self.draft_s += extra.get("draft_s", 0.0)
            self.verify_s += extra.get("verify_s", 0.0)

    def record_error(self, type_: str) -> None:
        with self._lock:
            self.errors[type_] = self.errors.get(type_, 0) + 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests": dict(self.requests), "errors": dict(self.errors), "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens, "verify_passes": self.verify_passes,
                "accept_length": self.produced / self.verify_passes if self.verify_passes else None,
                "accept_per_position": [a / r if r else 0.0 for a, r in zip(self.accept_counts, self.reach_counts)],
                "draft_s": self.draft_s, "verify_s": self.verify_s, "generation_s": self.generation_s,
                "last_tokens_per_s": self.last_tokens_per_s,
            }


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(snap: dict, *, model_name: str, mode: str) -> str:
    """Prometheus text exposition (version 0.0.4) of a `ServerMetrics.snapshot()`."""
    lines: list[str] = []

    def metric(name, kind, help_, samples):
        lines.append(f"# HELP specwire_{name} {help_}")
        lines.append(f"# TYPE specwire_{name} {kind}")
        for labels, value in samples:
            lab = "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}" if labels else ""
            lines.append(f"specwire_{name}{lab} {value!r}")

    metric("info", "gauge", "Served model and decoding mode.", [({"model": model_name, "mode": mode}, 1)])
    req = snap["requests"] or {"completions": 0, "chat_completions": 0}
    metric("requests_total", "counter", "Completed generation requests.",
           [({"endpoint": e}, n) for e, n in sorted(req.items())])
    metric("request_errors_total", "counter", "Requests refused or failed, by error type.",
           [({"type": t}, n) for t, n in sorted(snap["errors"].items())])
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
    if snap["last_tokens_per_s"] is not None:
        metric("last_request_tokens_per_second", "gauge", "Generated tokens per second of the last request.",
               [({}, float(snap["last_tokens_per_s"]))])
    metric("draft_seconds_total", "counter", "Seconds spent in the draft.", [({}, float(snap["draft_s"]))])
    metric("verify_seconds_total", "counter", "Seconds spent in target passes and verification.",
           [({}, float(snap["verify_s"]))])
    metric("generation_seconds_total", "counter", "Seconds spent generating.", [({}, float(snap["generation_s"]))])
    return "\n".join(lines) + "\n"


# ---- generation in the worker thread -------------------------------------------------------------------

class _Abort(Exception):
    """Raised from on_token to end a generation early (stop string hit, client gone)."""


@dataclass
class Outcome:
    """What one request produced."""

    text: str
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    seconds: float
    seed: int
    extra: dict  # engine metrics (empty for plain decoding or a stop-string ending)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def create_app(target, draft=None, *, spec=None, model_name: str | None = None):
    """The FastAPI app serving `target`, speculatively with `draft` (an engine draft) or plainly (None).

    spec: `engine.SpecConfig` (its `tree` picks tree or chain drafting); model_name: the name in
    /v1/models and the responses (default: the target's name).
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from specwire.decode.plain import plain_generate
    from specwire.decode.sampling import SamplingParams, make_generator

    if draft is not None:
        from specwire.decode.engine import SpecConfig, speculative_generate

        spec = spec or SpecConfig()
        mode = "tree" if spec.tree else "chain"
    else:
        mode = "plain"
    model_name = model_name or target.info.name
    context = target.info.max_position_embeddings
    metrics = ServerMetrics()
    created = int(time.time())
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specwire-serve")

    def decode(ids: list[int]) -> str:
        return target.tokenizer.decode(ids, skip_special_tokens=True)

    def run(req: GenRequest, on_text: Callable[[str], None] | None, cancelled: threading.Event) -> Outcome:
        """Decode one request (worker thread). on_text gets each newly released piece of text."""
        if cancelled.is_set():
            raise _Abort()
        seed = req.seed if req.seed is not None else secrets.randbits(32)
        params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
        gen = make_generator(seed, target.device)
        tracker = TextTracker(decode, req.stop)
        t0 = time.perf_counter()

        def on_token(tok: int) -> None:
            piece = tracker.add(tok)
            if piece and on_text:
                on_text(piece)
            if tracker.stopped or cancelled.is_set():
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
            if not tracker.stopped:
                raise
            finish = "stop"
        seconds = time.perf_counter() - t0
        rest = tracker.finish()
        if rest and on_text:
            on_text(rest)
        return Outcome(tracker.text, len(tracker.ids), finish, seconds, seed, extra)

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

    def error_response(e: Exception) -> JSONResponse:
        if isinstance(e, RequestError):
            metrics.record_error("invalid_request_error")
            return JSONResponse(error_body(str(e), param=e.param, code=e.code), status_code=e.status)
        if isinstance(e, SpecwireError):
            metrics.record_error("invalid_request_error")
            return JSONResponse(error_body(str(e)), status_code=400)
        log.error("specwire serve: request failed", exc_info=e)
        metrics.record_error("server_error")
        return JSONResponse(error_body("internal server error (see the server log)", type_="server_error"),
                            status_code=500)

    @asynccontextmanager
    async def lifespan(app):
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="specwire", version="1", lifespan=lifespan,
                  description="OpenAI-compatible local server over specwire's speculative engine.")
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return JSONResponse(error_body(str(exc.detail), type_="invalid_request_error" if exc.status_code < 500
                                       else "server_error"), status_code=exc.status_code)

    async def read_body(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON ({e}).") from None

    async def generate(request: Request, kind: str):
        try:
            body = await read_body(request)
            encode = (lambda p: target.tokenizer(p)["input_ids"]) if kind == "completion" else target.encode_chat
            req = parse_request(body, kind=kind, encode=encode, context=context, vocab_size=target.info.vocab_size,
                                model_name=model_name)
        except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI-style error, no traceback
            return error_response(e)
        endpoint = "completions" if kind == "completion" else "chat_completions"
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        now = int(time.time())
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        if not req.stream:
            try:
                out = await loop.run_in_executor(executor, run, req, None, cancelled)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            except Exception as e:  # noqa: BLE001
                return error_response(e)
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

        queue: asyncio.Queue = asyncio.Queue()

        def on_text(piece: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

        def work() -> Outcome:
            try:
                out = run(req, on_text, cancelled)
            except BaseException as e:
                if isinstance(e, _Abort):
                    metrics.record_error("cancelled")  # the client went away mid-stream
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))
                raise
            loop.call_soon_threadsafe(queue.put_nowait, ("done", out))
            return out

        async def events():
            future = loop.run_in_executor(executor, work)
            try:
                if kind == "chat":
                    yield sse(chunk(None, first=True))
                while True:
                    what, value = await queue.get()
                    if what == "text":
                        yield sse(chunk(value))
                    elif what == "error":
                        if not isinstance(value, _Abort):
                            resp = error_response(value)
                            yield sse(json.loads(resp.body))
                        break
                    else:
                        out = value
                        finished(endpoint, req, out)
                        last = chunk(None, out.finish_reason)
                        last["specwire"] = extension(out)
                        yield sse(last)
                        if req.include_usage:
                            yield sse({"id": rid, "object": obj, "created": now, "model": model_name, "choices": [],
                                       "usage": usage(req, out)})
                        break
                yield "data: [DONE]\n\n"
            finally:
                cancelled.set()  # a client gone mid-stream stops its generation at the next token
                future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieve, never re-raise

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
        return {"status": "ok", "model": model_name, "mode": mode}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(render_prometheus(metrics.snapshot(), model_name=model_name, mode=mode),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


# ---- command line ----------------------------------------------------------------------------------------

def add_cli(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)",
                       description="Serve the target over an OpenAI-compatible HTTP API: /v1/completions, "
                       "/v1/chat/completions (both with stream=true), /v1/models, /health and /metrics (Prometheus). "
                       "Decodes speculatively with the draft (lossless), or plainly with --no-draft. Requests are "
                       "processed one at a time, in arrival order.")
    add_model_options(p, draft=True, linear=True)
    p.add_argument("--no-draft", action="store_true", help="plain decoding, no speculation")
    add_draft_mode_option(p)
    p.add_argument("--num-steps", type=int, default=None, help="draft depth (default: the engine's)")
    p.add_argument("--topk", type=int, default=None, help="branching per tree step (default: the engine's)")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="draft tokens verified per tree pass "
                   "(default: the engine's)")
    p.add_argument("--model-name", default=None, help="model id in the API (default: the target's name)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, loopback only; the "
                   "server has no authentication)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.set_defaults(func=cmd_serve)


def spec_from_args(args: argparse.Namespace):
    """The `SpecConfig` the flags ask for (unset flags keep the engine's defaults)."""
    from specwire.decode.engine import SpecConfig

    given = {k: getattr(args, k) for k in ("num_steps", "topk", "num_draft_tokens") if getattr(args, k) is not None}
    return SpecConfig(tree=args.tree, **given)


def cmd_serve(args: argparse.Namespace) -> int:
    import sys

    import uvicorn

    from specwire.target.load import load_target

    if not 0 < args.port < 65536:
        raise SpecwireError(f"--port: expected 1-65535, found {args.port}.")
    spec = None if args.no_draft else spec_from_args(args)
    target = load_target(args.target, device=args.device, dtype=args.dtype, linear=args.linear)
    draft = None
    if not args.no_draft:
        from specwire.decode.engine import load_engine_draft

        draft = load_engine_draft(args.draft, target)
    app = create_app(target, draft, spec=spec, model_name=args.model_name)
    mode = "plain decoding" if draft is None else f"{'tree' if spec.tree else 'chain'} speculation with {args.draft}"
    print(f"specwire serve: {target.info.name} ({mode}) on http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0

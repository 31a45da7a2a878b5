"""The OpenAI wire protocol of `specwire serve`: request bodies in, validated `GenRequest`s out, errors as
OpenAI error bodies.

Owns: `RequestError` (an HTTP status with an OpenAI-style error body), `decode_body` (raw bytes ->
JSON value, refusing anything malformed with a 400: empty, not UTF-8, not JSON, NaN/Infinity, nesting
deeper than `MAX_JSON_DEPTH`, strings holding unpaired surrogates), `parse_request` (a JSON value ->
`GenRequest`, naming the offending field), `error_body` and `sse`. Pure functions: no HTTP framework,
no model, no threads. Does not own admission, timeouts or the app (`server.app`, `server.admission`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from specwire.errors import SpecwireError

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 256  # chat default, capped by the context left after the prompt
MAX_BODY_BYTES = 8 * 1024 * 1024  # larger request bodies get 413
MAX_JSON_DEPTH = 32  # objects/arrays nested deeper than this are refused (an OpenAI request nests 4 deep)
MIN_TEMPERATURE = 1e-6  # below this (and above 0) logits / temperature can overflow to inf: refused
SEED_RANGE = (-(2 ** 63), 2 ** 64)  # what torch.Generator.manual_seed takes

# Fields accepted with their neutral value only (anything else is refused, not silently ignored).
_NEUTRAL = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (None, False),
            "echo": (False,), "best_of": (1,), "top_logprobs": (None, 0)}
_COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options",
                  "stop", "user"} | set(_NEUTRAL)
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt"}
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens"}
CHAT_ROLES = ("system", "user", "assistant")


class RequestError(SpecwireError):
    """A refused request: HTTP `status` with an OpenAI-style error (`type_`, the offending `param`, a `code`).

    headers: extra response headers (a 429's Retry-After).
    """

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.param, self.status, self.code, self.type_ = param, status, code, type_
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(str(self), type_=self.type_, param=self.param, code=self.code)


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(obj: Any) -> str:
    """One server-sent event carrying `obj` as JSON."""
    return f"data: {json.dumps(obj)}\n\n"


# ---- raw body -> JSON value ---------------------------------------------------------------------------------

def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body, or a `RequestError` (400) saying what is malformed.

    Refuses: an empty body, bytes that are not UTF-8 (a leading BOM is tolerated), text that is not
    JSON (NaN and Infinity included), integers too long to convert, nesting deeper than
    `MAX_JSON_DEPTH`, and strings (keys included) holding an unpaired surrogate escape such as "\\ud800".
    """
    if not raw or not raw.strip():
        raise RequestError("the request body is empty; send a JSON object such as "
                           '{"prompt": "Hello", "max_tokens": 16}.')
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                           "send JSON encoded as UTF-8.") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise RequestError(f"the request body nests too deeply to parse; at most {MAX_JSON_DEPTH} levels are "
                           "accepted.") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer of more than 4300 digits
        raise RequestError(f"the request body is not valid JSON ({_short(str(e))}).") from None
    check_json_value(value)
    return value


def check_json_value(value: Any) -> None:
    """Refuse nesting deeper than `MAX_JSON_DEPTH` and strings that are not valid Unicode (iterative)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            _check_text(v, where)
        elif isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise RequestError(f"'{where or 'body'}': nested deeper than {MAX_JSON_DEPTH} levels; an OpenAI "
                                   "request needs far fewer.", param=_top(where))
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    _check_text(k, where)
                sub = (f"{where}.{k}" if where else str(k)) if isinstance(v, dict) else f"{where}[{k}]"
                stack.append((x, sub, depth + 1))


def _check_text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"'{where or 'body'}': the string holds an unpaired surrogate "
                           f"(\\u{ord(s[e.start]):04x} at character {e.start}), which is not valid Unicode; "
                           "send well-formed text.", param=_top(where)) from None


def _top(where: str) -> str | None:
    """The top-level field of a path such as 'messages[0].content'."""
    return where.split(".")[0].split("[")[0] or None


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# ---- JSON value -> GenRequest --------------------------------------------------------------------------------

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
    ok = not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
    if ok and not integer:
        try:
            ok = math.isfinite(float(v))  # an integer past float's range overflows here
        except OverflowError:
            ok = False
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise RequestError(f"'{name}': expected {kind}, found {type(v).__name__} {_short(repr(v), 60)}.", param=name)
    return v


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, found {type(body).__name__}.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unsupported field(s): {_short(', '.join(unknown))}. This server accepts: "
                           f"{', '.join(sorted(allowed))}.", param=unknown[0])
    for name, ok in _NEUTRAL.items():
        if name in body and body[name] not in ok:
            raise RequestError(f"'{name}': only {ok[0]!r} is supported here, found {_short(repr(body[name]), 60)}.",
                               param=name)


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
            raise RequestError(f"'{where}.role': expected one of {', '.join(CHAT_ROLES)}, found "
                               f"{_short(repr(role), 60)}.", param="messages")
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


def _encode(encode: Callable[[Any], list[int]], prompt: Any, param: str) -> list[int]:
    """Tokenize with the target's tokenizer; a tokenizer or chat-template refusal is the request's fault."""
    try:
        ids = encode(prompt)
    except Exception as e:  # noqa: BLE001 - e.g. a chat template raising on an unusual role order
        raise RequestError(f"'{param}': the target's tokenizer could not encode it ({type(e).__name__}: "
                           f"{_short(str(e))}).", param=param) from None
    return [int(t) for t in ids]


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
        raise RequestError(f"model {_short(repr(model), 80)} is not served here; this server serves '{model_name}'.",
                           param="model", status=404, code="model_not_found")
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("'prompt': empty prompt; give at least one character.", param="prompt")
            prompt_ids = _encode(encode, prompt, "prompt")
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            bad = [t for t in prompt if not 0 <= t < vocab_size]
            if bad:
                raise RequestError(f"'prompt': token id {_short(str(bad[0]), 40)} is outside the vocabulary "
                                   f"[0, {vocab_size}).", param="prompt")
            prompt_ids = list(prompt)  # token ids, as OpenAI accepts
        else:
            raise RequestError("'prompt': expected a non-empty string (or a list of token ids), found "
                               f"{type(prompt).__name__}.", param="prompt")
        default_max = DEFAULT_COMPLETION_MAX_TOKENS
    else:
        prompt_ids = _encode(encode, parse_messages(body.get("messages")), "messages")
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
        raise RequestError(f"'{name}': expected an integer >= 1, found {_short(str(max_tokens), 40)}.", param=name)
    elif room is not None and max_tokens > room:
        raise RequestError(f"'{name}' {_short(str(max_tokens), 40)} + prompt ({len(prompt_ids)} tokens) exceeds the "
                           f"model's context of {context} positions; use max_tokens <= {room}.", param=name)

    temperature = _number(body, "temperature", 0.0)
    top_p = _number(body, "top_p", 1.0)
    top_k = _number(body, "top_k", 0, integer=True)
    seed = _number(body, "seed", None, integer=True)
    if temperature < 0:
        raise RequestError(f"'temperature': expected a number >= 0 (0 = greedy), found {temperature}.",
                           param="temperature")
    if 0 < temperature < MIN_TEMPERATURE:
        raise RequestError(f"'temperature': {temperature} is too small to sample with (logits / temperature "
                           f"overflows); use 0 for greedy or a value >= {MIN_TEMPERATURE}.", param="temperature")
    if not 0 < top_p <= 1:
        raise RequestError(f"'top_p': expected a number in (0, 1], found {top_p}.", param="top_p")
    if top_k < 0:
        raise RequestError(f"'top_k': expected an integer >= 0 (0 = off), found {_short(str(top_k), 40)}.",
                           param="top_k")
    if seed is not None and not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise RequestError(f"'seed': expected an integer in [-2**63, 2**64), found {_short(str(seed), 40)}.",
                           param="seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream': expected true or false, found {_short(repr(stream), 60)}.", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise RequestError("'stream_options': expected {\"include_usage\": true|false}.", param="stream_options")
    if not isinstance(body.get("user", ""), str):
        raise RequestError("'user': expected a string (an end-user id).", param="user")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop': expected a non-empty string or a list of up to 4 non-empty strings.", param="stop")
    return GenRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                      top_k=top_k, seed=seed, stream=stream, include_usage=opts.get("include_usage", False), stop=stop)

"""Answers from an OpenAI-compatible server, for `specwire datagen --generator URL`.

Owns: the HTTP client that asks a server (`specwire serve`, vLLM, SGLang, llama.cpp, ...) for chat
completions (POST {URL}/v1/chat/completions with the prompt's messages, `max_tokens` and the sampling
options), and turning an answer's text into the target's token ids. Does not own the dump (`datagen`
stores the conversations and captures the states as for the target's own answers).

Token ids: a server returns text, so the answer is re-tokenized with the target's tokenizer. The
conversation (prompt + answer) is templated with the target's chat template and the answer's ids are
what follows the templated prompt, up to and including the end-of-turn token the template writes
(when that token is one of the target's EOS ids and the answer finished with "stop"). When the
template does not reproduce the prompt's ids as a prefix, the answer text is tokenized on its own and
the target's first EOS id appended. Either way the ids are the target's reading of the text, not the
ids the server sampled: datagen records the server in the manifest (`generator`) for that reason.

Busy servers: a request answered 429 (too many requests), 503 (unavailable, e.g. still loading) or 408
(request timeout) is sent again after the wait the server's Retry-After header asks for (seconds or an
HTTP date), else after an exponential backoff; `RetryPolicy` bounds both the number of retries and the
total wait, and a SpecwireError says so when they run out. Any other HTTP error fails at once.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Sequence

from specwire.errors import SpecwireError
from specwire.target.load import Target

TIMEOUT_S = 600.0  # per request: a long answer on a slow server


@dataclass(frozen=True)
class ServerAnswer:
    text: str  # the assistant message's content
    finish: str  # the server's finish_reason ("stop", "length", ...)


RETRY_STATUSES = (408, 429, 503)  # request timeout, too many requests, service unavailable: worth sending again


@dataclass(frozen=True)
class RetryPolicy:
    """How long `_post` keeps asking a busy server (HTTP 408/429/503) before giving up."""

    max_retries: int = 8  # requests sent again after the first one, at most
    max_total_wait_s: float = 300.0  # total sleep between attempts, at most (a longer Retry-After gives up at once)
    backoff_s: float = 1.0  # first wait when the server sends no Retry-After; doubled each retry
    max_backoff_s: float = 30.0  # cap on one backoff wait without Retry-After

    def __post_init__(self):
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise SpecwireError(f"RetryPolicy.max_retries: expected an integer >= 0, found {self.max_retries!r}.")
        for name in ("max_total_wait_s", "backoff_s", "max_backoff_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SpecwireError(f"RetryPolicy.{name}: expected a finite number >= 0, found {v!r}.")

    def backoff(self, retry: int) -> float:
        """The wait before retry number `retry` (0-based) when the server names none."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** retry)


DEFAULT_RETRY = RetryPolicy()


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """A Retry-After header as seconds from now (>= 0): delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    v = value.strip()
    try:
        secs = float(v)
    except ValueError:
        try:
            when = parsedate_to_datetime(v)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        secs = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, secs) if math.isfinite(secs) else None


def _post(url: str, body: dict, *, timeout: float = TIMEOUT_S, retry: RetryPolicy = DEFAULT_RETRY,
          sleep: Callable[[float], None] = time.sleep) -> dict:
    """POST `body` as JSON and read a JSON answer, sending it again while the server says it is busy."""
    data = json.dumps(body).encode()
    waited = 0.0
    for attempt in range(retry.max_retries + 1):
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            if e.code not in RETRY_STATUSES:
                raise SpecwireError(
                    f"--generator {url}: the server answered HTTP {e.code}: {detail}",
                    fix="check the server's log, the --generator-model name and the request options.") from None
            asked = retry_after_s(e.headers.get("Retry-After") if e.headers else None)
            wait = asked if asked is not None else retry.backoff(attempt)
            busy = f"--generator {url}: the server is busy (HTTP {e.code}"
            if attempt == retry.max_retries:
                raise SpecwireError(f"{busy}) after {retry.max_retries} retries over {waited:.1f} s of waiting: {detail}",
                                    fix="lower --batch-size (requests sent at once), or give the server more capacity, "
                                        "then rerun the same command (datagen resumes).") from None
            if waited + wait > retry.max_total_wait_s:
                said = f"asks for {wait:.1f} s more" if asked is not None else f"would need {wait:.1f} s more"
                raise SpecwireError(f"{busy}) and {said}, beyond the {retry.max_total_wait_s:.0f} s of waiting allowed "
                                    f"({waited:.1f} s spent over {attempt} retries): {detail}",
                                    fix="rerun when the server is ready (datagen resumes), or lower --batch-size.") from None
            sleep(wait)
            waited += wait
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise SpecwireError(f"--generator {url}: no usable answer ({e}).",
                                fix="start the server first, and pass its base URL (e.g. http://127.0.0.1:8000).") from None
    raise AssertionError("unreachable")  # the loop returns or raises


def base_url(url: str) -> str:
    """'http://host:8000', '.../v1' or '.../v1/' -> 'http://host:8000/v1'."""
    u = url.rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise SpecwireError(f"--generator: expected an http(s) URL such as http://127.0.0.1:8000, found {url!r}.")
    return u if u.endswith("/v1") else u + "/v1"


def server_model(url: str) -> str:
    """The first model the server lists at /v1/models."""
    try:
        with urllib.request.urlopen(base_url(url) + "/models", timeout=60) as r:
            data = json.loads(r.read()).get("data") or []
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SpecwireError(f"--generator {url}: cannot list its models at /v1/models ({e}).",
                            fix="start the server first, or pass --generator-model NAME.") from None
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise SpecwireError(f"--generator {url}: /v1/models lists no model.", fix="pass --generator-model NAME.")
    return str(data[0]["id"])


def ask(url: str, model: str, messages: Sequence[dict], *, max_tokens: int, temperature: float, top_p: float,
        top_k: int, seed: int) -> ServerAnswer:
    """One chat completion."""
    body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages], "max_tokens": max_tokens,
                            "temperature": temperature}
    if temperature > 0:
        body.update(top_p=top_p, seed=seed)
        if top_k:
            body["top_k"] = top_k
    out = _post(base_url(url) + "/chat/completions", body)
    try:
        choice = out["choices"][0]
        return ServerAnswer(text=str(choice["message"]["content"] or ""), finish=str(choice.get("finish_reason") or "stop"))
    except (KeyError, IndexError, TypeError):
        raise SpecwireError(f"--generator {url}: expected an OpenAI chat completion, found {str(out)[:200]!r}.") from None


def ask_all(url: str, model: str, prompts: Sequence[Sequence[dict]], *, max_tokens: Sequence[int], temperature: float,
            top_p: float, top_k: int, seed: int) -> list[ServerAnswer]:
    """A batch of chat completions, sent concurrently (a server batches them); answers in prompt order."""
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        futures = [pool.submit(ask, url, model, msgs, max_tokens=n, temperature=temperature, top_p=top_p, top_k=top_k,
                               seed=seed + i) for i, (msgs, n) in enumerate(zip(prompts, max_tokens))]
        return [f.result() for f in futures]


def answer_ids(target: Target, messages: Sequence[dict], prompt_ids: Sequence[int], answer: ServerAnswer) -> list[int]:
    """The target's token ids for a server's answer after `prompt_ids` (see the module docstring)."""
    tok = target.tokenizer
    eos = set(target.eos_token_ids)
    if answer.finish == "stop":
        full = target.encode_chat([*map(dict, messages), {"role": "assistant", "content": answer.text}],
                                  add_generation_prompt=False)
        tail = full[len(prompt_ids):]
        if list(full[:len(prompt_ids)]) == list(prompt_ids):
            end = next((i for i, t in enumerate(tail) if t in eos), None)
            if end is not None:
                return list(tail[:end + 1])
        return [*tok(answer.text, add_special_tokens=False)["input_ids"], target.eos_token_ids[0]]
    return list(tok(answer.text, add_special_tokens=False)["input_ids"])

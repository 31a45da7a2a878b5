"""`datagen --generator URL`: a busy server (HTTP 429/503/408) is asked again, honouring Retry-After.

A tiny local HTTP server (http.server in a thread) plays the OpenAI-compatible server: it answers from a
script of (status, headers) replies, then a chat completion. No models.
"""

from __future__ import annotations

import json
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specwire.data.generator import RetryPolicy, _post, ask, retry_after_s
from specwire.errors import SpecwireError

COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}


class Server:
    """Serves POST /v1/chat/completions: the scripted error replies first, then COMPLETION."""

    def __init__(self, script: list[tuple[int, dict]]):
        self.script = list(script)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                n = int(self.headers.get("Content-Length", 0))
                outer.requests.append(json.loads(self.rfile.read(n)))
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                payload = json.dumps(COMPLETION if status == 200 else {"error": f"status {status}"}).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def ask_hi(url: str):
    return ask(url, "m", [{"role": "user", "content": "hi"}], max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0)


def test_429_with_retry_after_zero_is_retried_once_then_answered():
    with Server([(429, {"Retry-After": "0"})]) as s:
        answer = ask_hi(s.url)
    assert answer.text == "hello" and answer.finish == "stop"
    assert len(s.requests) == 2 and s.requests[0] == s.requests[1]  # the same request, sent again


def test_waits_follow_retry_after_then_the_backoff():
    waits: list[float] = []
    policy = RetryPolicy(max_retries=3, max_total_wait_s=60, backoff_s=0.5)
    with Server([(503, {"Retry-After": "2"}), (408, {}), (429, {"Retry-After": "0"})]) as s:
        out = _post(s.url + "/v1/chat/completions", {"x": 1}, retry=policy, sleep=waits.append)
    assert out == COMPLETION and len(s.requests) == 4
    assert waits == [2.0, 1.0, 0.0]  # Retry-After 2 s; no header on retry 1: 0.5 * 2**1; Retry-After 0


def test_exhausted_retries_and_wait_budget_fail_clearly():
    waits: list[float] = []
    with Server([(503, {"Retry-After": "0"})] * 3) as s:
        with pytest.raises(SpecwireError, match=r"busy \(HTTP 503\) after 2 retries") as e:
            _post(s.url + "/v1/chat/completions", {}, retry=RetryPolicy(max_retries=2), sleep=waits.append)
    assert len(s.requests) == 3 and waits == [0.0, 0.0] and "lower --batch-size" in str(e.value)
    with Server([(429, {"Retry-After": "120"})]) as s:
        with pytest.raises(SpecwireError, match=r"asks for 120.0 s more, beyond the 60 s of waiting allowed"):
            _post(s.url + "/v1/chat/completions", {}, retry=RetryPolicy(max_total_wait_s=60), sleep=waits.append)
    assert len(s.requests) == 1 and waits == [0.0, 0.0]  # gave up without sleeping


def test_other_errors_are_not_retried():
    with Server([(400, {}), (200, {})]) as s:
        with pytest.raises(SpecwireError, match="answered HTTP 400"):
            ask_hi(s.url)
    assert len(s.requests) == 1


def test_retry_after_header_forms():
    assert retry_after_s("0") == 0.0 and retry_after_s(" 3 ") == 3.0 and retry_after_s("1.5") == 1.5
    assert retry_after_s(None) is None and retry_after_s("soon") is None and retry_after_s("") is None
    assert retry_after_s("-4") == 0.0
    now = 1_700_000_000.0
    assert retry_after_s(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30.0)
    assert retry_after_s(formatdate(now - 30, usegmt=True), now=now) == 0.0
    with pytest.raises(SpecwireError, match="max_retries"):
        RetryPolicy(max_retries=-1)

"""`specwire serve` through real uvicorn on loopback: a server that degrades, never breaks.

Admission and body decoding as pure functions; then the app on the tiny target under real uvicorn (a
thread, or a `specwire serve` subprocess for SIGTERM): concurrent clients, a client dropping its stream,
overload answered with 429 + Retry-After, per-request time limits, the malformed-body fuzz set of
tools/serve_load.py (no 5xx, no hang), and the graceful shutdown. Slow decoding, where a test needs a
request to stay in flight, comes from wrapping `plain_generate` with a sleep per token.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import specwire.decode.plain as plain_module
from specwire.decode.engine import SpecConfig, load_engine_draft
from specwire.server import Admission, RequestError, ServeConfig, create_app, decode_body, make_server
from specwire.server.protocol import MAX_JSON_DEPTH

from helpers import make_draft_dir

MODEL = "tiny"
_spec = importlib.util.spec_from_file_location("serve_load", Path(__file__).resolve().parents[2] / "tools" / "serve_load.py")
load = importlib.util.module_from_spec(_spec)
sys.modules["serve_load"] = load
_spec.loader.exec_module(load)


# ---- pure parts ------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_admission_bounds_the_queue_and_says_when_to_retry():
    clock = Clock()
    adm = Admission(max_queue=2, request_timeout=10, clock=clock)
    tickets = [adm.admit() for _ in range(3)]  # one decoding + two waiting
    with pytest.raises(RequestError) as e:
        adm.admit()
    assert e.value.status == 429 and e.value.code == "queue_full" and e.value.headers["Retry-After"] == "1"
    tickets[0].start()
    assert adm.snapshot()["waiting"] == 2 and adm.snapshot()["running"] == 1
    tickets[0].release(3.2)  # one request took 3.2 s: a slot frees in about that long
    tickets[0].release(99.0)  # released once only
    assert adm.active == 2
    adm.admit()
    with pytest.raises(RequestError) as e:
        adm.admit()
    assert e.value.headers["Retry-After"] == "4"
    # deadlines run from admission
    assert tickets[1].remaining() == 10 and not tickets[1].expired()
    clock.t += 10
    assert tickets[1].expired() and tickets[1].remaining() == 0


def test_ticket_cancellation_is_first_reason_wins_and_reaches_listeners():
    adm = Admission(max_queue=4)
    t = adm.admit()
    seen = []
    t.on_cancel(seen.append)
    assert t.cancel("timeout") and not t.cancel("shutdown")
    assert t.reason == "timeout" and seen == ["timeout"]
    t.on_cancel(seen.append)  # already cancelled: called at once
    assert seen == ["timeout", "timeout"]
    t.release()
    assert adm.active == 0 and t.remaining() is None  # no limit


def test_draining_refuses_new_requests_with_503_and_cancel_all_reaches_every_ticket():
    adm = Admission(max_queue=4)
    a, b = adm.admit(), adm.admit()
    b.release()
    adm.begin_drain()
    with pytest.raises(RequestError) as e:
        adm.admit()
    assert e.value.status == 503 and e.value.code == "shutting_down" and e.value.headers["Retry-After"]
    assert adm.cancel_all("shutdown") == 1 and a.reason == "shutdown" and b.reason is None


@pytest.mark.parametrize("raw, what", [
    (b"", "empty"),
    (b"[" * 5000 + b"]" * 5000, "nests too deeply"),
    (b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), f"deeper than {MAX_JSON_DEPTH}"),
    (b'{"prompt": "x\\ud800"}', "unpaired surrogate"),
    (b'{"\\udc00": 1}', "unpaired surrogate"),
    (b'{"prompt": "\xff"}', "not valid UTF-8"),
    (b'{"max_tokens": NaN}', "not valid JSON"),
    (b'{"max_tokens": ' + b"1" * 5000 + b"}", "not valid JSON"),
])
def test_decode_body_refuses_malformed_bodies_with_400(raw, what):
    with pytest.raises(RequestError) as e:
        decode_body(raw)
    assert e.value.status == 400 and what in str(e.value)


def test_decode_body_reads_json_with_a_bom_and_real_non_ascii():
    assert decode_body('\ufeff{"prompt": "h\u00e9 \U0001f600 \\ud83d\\ude00"}'.encode()) == {"prompt": "h\u00e9 \U0001f600 \U0001f600"}


# ---- real uvicorn on loopback ----------------------------------------------------------------------------------

@contextlib.contextmanager
def live(app, config: ServeConfig):
    """Serve `app` with the graceful uvicorn server in a thread; yields (base url, server)."""
    server = make_server(app, config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        assert thread.is_alive() and time.monotonic() - t0 < 30, "uvicorn did not start"
        time.sleep(0.02)
    server.thread = thread
    try:
        yield f"http://{config.host}:{config.port}", server
    finally:
        server.should_exit = True
        thread.join(30)


def make_app(target, draft=None, *, delay: float = 0.0, **config):
    """An app on `target`; delay: seconds of sleep per generated token (plain decoding only)."""
    config = ServeConfig(port=load.free_port(), **config)
    real = plain_module.plain_generate
    if delay:
        def slow(*args, on_token=None, **kw):
            def on(tok):
                time.sleep(delay)
                if on_token:
                    on_token(tok)
            return real(*args, on_token=on, **kw)

        plain_module.plain_generate = slow  # create_app binds the function now
    try:
        spec = SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=5)
        return create_app(target, draft, spec=spec, model_name=MODEL, config=config), config
    finally:
        plain_module.plain_generate = real


def samples(base):
    text = load.request(base, "GET", "/metrics").body.decode()
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def events_of(reply):
    assert reply.status == 200, reply
    events = reply.json()
    return [json.loads(e) for e in events if e != "[DONE]"], events[-1:] == ["[DONE]"]


@pytest.fixture(scope="module")
def draft(tiny_llama_target, tmp_path_factory):
    return load_engine_draft(make_draft_dir(tiny_llama_target, tmp_path_factory.mktemp("http-draft") / "d"),
                             tiny_llama_target)


@pytest.fixture(scope="module")
def server(tiny_llama_target, draft):
    """Tree speculation with a random tiny draft."""
    app, config = make_app(tiny_llama_target, draft, max_queue=64)
    with live(app, config) as (base, _):
        yield base


@pytest.fixture(scope="module")
def plain_server(tiny_llama_target):
    app, config = make_app(tiny_llama_target, max_queue=64)
    with live(app, config) as (base, _):
        yield base


def test_concurrent_clients_each_get_their_own_lossless_answer(server, tiny_llama_target):
    t = tiny_llama_target
    prompts = [f"Client {i} says" for i in range(8)]
    refs = [t.tokenizer.decode(plain_module.plain_generate(t, t.tokenizer(p)["input_ids"], max_new_tokens=12).output_ids,
                               skip_special_tokens=True) for p in prompts]
    results = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def client(i):
        gate.wait()
        body = {"prompt": prompts[i], "max_tokens": 12}
        if i % 2:
            chunks, done = events_of(load.stream_request(server, load.CMPL, body))
            results[i] = "".join(c["choices"][0]["text"] for c in chunks) if done else None
        else:
            r = load.request(server, "POST", load.CMPL, json.dumps(body).encode())
            results[i] = r.json()["choices"][0]["text"] if r.status == 200 else r

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert results == refs
    assert settled(server)


def settled(base, timeout: float = 10.0) -> bool:
    """Queue and running gauges back at 0. The worker releases a request's slot just after its last text is
    handed to the response, so a client can read /metrics a moment before that: poll, do not read once."""
    end = time.monotonic() + timeout
    while True:
        s = samples(base)
        if s["specwire_queue_depth"] == "0" and s["specwire_requests_running"] == "0":
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def test_malformed_bodies_get_their_4xx_never_a_5xx_and_never_hang(plain_server):
    assert len(load.MALFORMED) >= 40
    res = load.fuzz(plain_server, timeout=30)
    assert not res.server_errors and not res.no_answer and not res.unexpected, (res.server_errors, res.no_answer,
                                                                                  res.unexpected)
    assert res.as_expected == len(load.MALFORMED) and res.healthy_after


def test_a_dropped_stream_stops_its_generation_and_the_server_keeps_serving(tiny_llama_target):
    app, config = make_app(tiny_llama_target, delay=0.02, max_queue=4)
    with live(app, config) as (base, _):
        r = load.stream_request(base, load.CMPL, {"prompt": "drop me", "max_tokens": 200}, drop_after=2)
        assert r.status == 200 and len(r.json()) == 2  # hung up mid-stream
        t0 = time.monotonic()
        ok = load.request(base, "POST", load.CMPL, json.dumps({"prompt": "next", "max_tokens": 3}).encode())
        assert ok.status == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        assert time.monotonic() - t0 < 3.0  # not stuck behind the 200 tokens of the dropped stream
        assert samples(base)['specwire_request_errors_total{type="cancelled"}'] == "1"


def test_a_non_streamed_client_that_hangs_up_frees_its_slot(tiny_llama_target):
    import http.client

    app, config = make_app(tiny_llama_target, delay=0.02, max_queue=0)  # one slot, nothing waits
    with live(app, config) as (base, _):
        conn = http.client.HTTPConnection(config.host, config.port, timeout=10)
        conn.request("POST", load.CMPL, body=json.dumps({"prompt": "gone", "max_tokens": 200}),
                     headers={"Content-Type": load.JSON})
        time.sleep(0.3)  # decoding now
        conn.close()  # hang up without reading the answer
        t0 = time.monotonic()
        while True:  # the slot frees at the next token, not after the 200 tokens
            r = load.request(base, "POST", load.CMPL, json.dumps({"prompt": "next", "max_tokens": 2}).encode())
            if r.status == 200:
                break
            assert r.status == 429 and time.monotonic() - t0 < 2.5
            time.sleep(0.05)
        assert samples(base)['specwire_request_errors_total{type="cancelled"}'] == "1"


def test_overload_is_answered_with_429_and_retry_after(tiny_llama_target):
    app, config = make_app(tiny_llama_target, delay=0.05, max_queue=2)
    with live(app, config) as (base, _):
        n = 8
        replies = [None] * n
        gate = threading.Barrier(n)

        def client(i):
            gate.wait()
            replies[i] = load.request(base, "POST", load.CMPL, json.dumps({"prompt": f"hi {i}", "max_tokens": 10}).encode())

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        ok = [r for r in replies if r.status == 200]
        refused = [r for r in replies if r.status == 429]
        assert len(ok) + len(refused) == n and len(ok) >= 3 and refused  # 1 decoding + 2 waiting at least
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full" and r.json()["error"]["type"] == "rate_limit_error"
        for r in ok:
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        s = samples(base)
        assert s['specwire_rejected_requests_total{reason="queue_full"}'] == str(len(refused))
        assert s["specwire_queue_capacity"] == "2"


def test_request_timeout_ends_with_a_clear_error_queued_running_or_streamed(tiny_llama_target):
    app, config = make_app(tiny_llama_target, delay=0.05, max_queue=4, request_timeout=0.6)
    with live(app, config) as (base, _):
        body = json.dumps({"prompt": "slow", "max_tokens": 100}).encode()
        replies = {}
        first = threading.Thread(target=lambda: replies.setdefault("running", load.request(base, "POST", load.CMPL, body)))
        first.start()
        time.sleep(0.1)
        replies["queued"] = load.request(base, "POST", load.CMPL, body)  # waits behind the first, times out queued
        first.join(10)
        for r in replies.values():
            assert r.status == 408 and r.seconds < 3.0
            err = r.json()["error"]
            assert err["type"] == "timeout_error" and err["code"] == "request_timeout" and "--request-timeout" in err["message"]
        chunks, done = events_of(load.stream_request(base, load.CMPL, {"prompt": "slow", "max_tokens": 100}))
        assert done and chunks[-1]["error"]["code"] == "request_timeout"
        assert load.request(base, "POST", load.CMPL, json.dumps({"prompt": "quick", "max_tokens": 2}).encode()).status == 200
        assert float(samples(base)['specwire_request_errors_total{type="timeout"}']) >= 2


def test_shutdown_refuses_new_requests_and_lets_in_flight_ones_finish(tiny_llama_target):
    app, config = make_app(tiny_llama_target, delay=0.05, max_queue=4, shutdown_timeout=20)
    with live(app, config) as (base, server):
        started, out = threading.Event(), {}
        th = threading.Thread(target=lambda: out.setdefault("r", load.stream_request(
            base, load.CMPL, {"prompt": "finish me", "max_tokens": 30}, on_event=lambda n: started.set())))
        th.start()
        assert started.wait(20)
        server.handle_exit(signal.SIGTERM, None)
        t0 = time.monotonic()
        while samples(base).get("specwire_draining") != "1":
            assert time.monotonic() - t0 < 5
            time.sleep(0.05)
        r = load.request(base, "POST", load.CMPL, json.dumps({"prompt": "too late"}).encode())
        assert r.status == 503 and r.json()["error"]["code"] == "shutting_down" and r.headers["retry-after"]
        assert load.request(base, "GET", "/health").status == 503
        th.join(30)
        chunks, done = events_of(out["r"])
        assert done and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # finished, not cut
        server.thread.join(15)
        assert not server.thread.is_alive()


def test_shutdown_cancels_requests_still_running_past_its_limit(tiny_llama_target):
    app, config = make_app(tiny_llama_target, delay=0.05, max_queue=4, shutdown_timeout=0.3)
    with live(app, config) as (base, server):
        started, out = threading.Event(), {}
        th = threading.Thread(target=lambda: out.setdefault("r", load.stream_request(
            base, load.CMPL, {"prompt": "cut me", "max_tokens": 200}, on_event=lambda n: started.set())))
        th.start()
        assert started.wait(20)
        t0 = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)
        th.join(30)
        chunks, done = events_of(out["r"])
        assert done and chunks[-1]["error"]["code"] == "shutting_down"
        server.thread.join(15)
        assert not server.thread.is_alive() and time.monotonic() - t0 < 8


def test_sigterm_on_specwire_serve_drains_the_in_flight_request_and_exits_0(tiny_target):
    proc, base = load.start_server(["--target", str(tiny_target("llama")), "--no-draft", "--threads", "1",
                                    "--shutdown-timeout", "30"])
    try:
        load.wait_healthy(base, proc, timeout=120)
        started, out = threading.Event(), {}
        th = threading.Thread(target=lambda: out.setdefault("r", load.stream_request(
            base, load.CMPL, {"prompt": "in flight", "max_tokens": 240}, on_event=lambda n: started.set())))
        th.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        th.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    chunks, done = events_of(out["r"])
    last = chunks[-1]
    # completed (the drain's default) or, had it run past --shutdown-timeout, a clean error event
    assert done and (last.get("choices") and last["choices"][0]["finish_reason"]
                     or last["error"]["code"] == "shutting_down")


@pytest.mark.slow
def test_load_script_on_the_tiny_target(tiny_target, tmp_path):
    """tools/serve_load.py as in docs/SERVING.md, on the tiny target: 32 clients x 64 tokens against
    --max-queue 8, the fuzz set, 500 requests of every kind with RSS within 10%, SIGTERM exit 0."""
    rc = load.main(["--serve-args", f"--target {tiny_target('llama')} --no-draft", "--clients", "32", "--tokens", "64",
                    "--rss-requests", "500", "--json", "--log", str(tmp_path / "server.log")])
    assert rc == 0, (tmp_path / "server.log").read_text()[-3000:]

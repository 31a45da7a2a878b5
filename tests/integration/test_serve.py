"""`specwire serve`: request validation, stop strings and metrics as pure functions; the HTTP app on a tiny
target with a random tiny draft (lossless against plain greedy decoding, streaming, errors, /metrics)."""

from __future__ import annotations

import json

import pytest

from specwire.cli import main
from specwire.decode.engine import SpecConfig, load_engine_draft
from specwire.decode.plain import plain_generate
from specwire.decode.text import TextStream as TextTracker
from specwire.server import RequestError, ServerMetrics, create_app, parse_request, render_prometheus

from helpers import feed_stream, make_draft_dir, toy_decode

MODEL = "tiny"


# ---- pure parts --------------------------------------------------------------------------------------------

def test_text_tracker_releases_everything_without_stop_strings_but_holds_half_characters():
    t = TextTracker(toy_decode, [])
    assert t.add(ord("a")) == "a"
    assert t.add(0) == ""  # half a character: held back
    assert t.add(ord("b")) == "éb"
    assert t.finish() == "" and t.text == "aéb" and not t.stopped


def test_text_tracker_stops_at_the_first_stop_string_even_across_tokens():
    ids = [ord(c) for c in "hello END world"]
    t = TextTracker(toy_decode, ["END", "wor"])
    pieces = feed_stream(t, ids)
    assert t.stopped and t.text == "hello " and "".join(pieces) == "hello "
    assert len(t.ids) == len("hello EN") + 1  # stopped at the token completing the stop string
    # the released pieces never contain the start of a stop string before it is complete
    t = TextTracker(toy_decode, ["xyz"])
    pieces = feed_stream(t, [ord(c) for c in "abxyxyz"])
    assert "".join(pieces) == "abxy" and t.text == "abxy"


def test_text_tracker_stream_equals_final_text_when_no_stop_is_hit():
    ids = [ord(c) for c in "no stop here"] + [0, ord("!")]
    t = TextTracker(toy_decode, ["zz", "q"])
    assert "".join(feed_stream(t, ids)) == t.text == "no stop hereé!"
    assert not t.stopped


def _parse(body, kind="completion", context=64, vocab=100):
    encode = (lambda p: [1] * len(p)) if kind == "completion" else (lambda msgs: [1] * sum(len(m["content"]) for m in msgs))
    return parse_request(body, kind=kind, encode=encode, context=context, vocab_size=vocab, model_name=MODEL)


def test_parse_request_defaults_and_fields():
    r = _parse({"prompt": "abcd"})
    assert r.prompt_ids == [1, 1, 1, 1] and r.max_tokens == 16 and r.temperature == 0 and r.stop == [] and not r.stream
    r = _parse({"prompt": [5, 6], "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 4,
                "stream": True, "stream_options": {"include_usage": True}, "stop": "\n", "model": MODEL, "n": 1})
    assert (r.prompt_ids, r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed) == ([5, 6], 3, 0.7, 0.9, 5, 4)
    assert r.stream and r.include_usage and r.stop == ["\n"]
    chat = _parse({"messages": [{"role": "system", "content": "ab"},
                                {"role": "user", "content": [{"type": "text", "text": "cd"}]}]}, kind="chat", context=40)
    assert chat.prompt_ids == [1] * 4 and chat.max_tokens == 36  # default capped by the context left


@pytest.mark.parametrize("body, param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": [1, 500]}, "prompt"),
    ({"prompt": "ab", "temperature": -0.5}, "temperature"),
    ({"prompt": "ab", "temperature": "hot"}, "temperature"),
    ({"prompt": "ab", "max_tokens": 63}, "max_tokens"),  # 2 + 63 > 64 positions
    ({"prompt": "ab", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "ab", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "ab", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "ab", "top_p": 0}, "top_p"),
    ({"prompt": "ab", "stream": "yes"}, "stream"),
    ({"prompt": "ab", "stop": ["a", 3]}, "stop"),
    ({"prompt": "ab", "n": 2}, "n"),
    ({"prompt": "ab", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"prompt": "x" * 64}, "prompt"),  # no room left for one token
])
def test_parse_request_refuses_bad_completion_requests(body, param):
    with pytest.raises(RequestError) as e:
        _parse(body)
    assert e.value.param == param and e.value.status == 400 and param in str(e.value)


@pytest.mark.parametrize("body", [{"messages": []}, {"messages": [{"role": "robot", "content": "x"}]},
                                  {"messages": [{"role": "user", "content": 5}]}, {"prompt": "x"}, ["not", "a", "dict"]])
def test_parse_request_refuses_bad_chat_requests(body):
    with pytest.raises(RequestError) as e:
        _parse(body, kind="chat")
    assert e.value.status == 400


def test_parse_request_unknown_model_is_404():
    with pytest.raises(RequestError) as e:
        _parse({"prompt": "ab", "model": "gpt-4"})
    assert e.value.status == 404 and e.value.param == "model" and e.value.code == "model_not_found"


def test_metrics_aggregate_requests_and_render_prometheus():
    m = ServerMetrics()
    m.record("completions", prompt_tokens=5, completion_tokens=8, seconds=2.0,
             extra={"accept_length": 2.0, "num_verify_passes": 4, "accept_counts": [3, 1], "reach_counts": [4, 3],
                    "draft_s": 0.5, "verify_s": 1.0, "lookup": {"rounds": 2, "tokens": 9, "accepted": 3}})
    m.record("chat_completions", prompt_tokens=3, completion_tokens=4, seconds=1.0,
             extra={"accept_length": 1.0, "num_verify_passes": 4, "accept_counts": [0, 0, 0], "reach_counts": [4, 0, 0],
                    "draft_s": 0.25, "verify_s": 0.5})
    m.record_error("invalid_request_error")
    snap = m.snapshot()
    assert snap["accept_length"] == pytest.approx(12 / 8)
    assert snap["accept_per_position"] == pytest.approx([3 / 8, 1 / 3, 0.0])
    text = render_prometheus(snap, model_name=MODEL, mode="tree")
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert samples['specwire_requests_total{endpoint="completions"}'] == "1"
    assert samples['specwire_requests_total{endpoint="chat_completions"}'] == "1"
    assert samples["specwire_generated_tokens_total"] == "12"
    assert float(samples["specwire_accept_length_mean"]) == pytest.approx(1.5)
    assert float(samples['specwire_accept_rate{position="1"}']) == pytest.approx(1 / 3)
    assert float(samples["specwire_last_request_tokens_per_second"]) == pytest.approx(4.0)
    assert float(samples["specwire_draft_seconds_total"]) == pytest.approx(0.75)
    assert samples['specwire_request_errors_total{type="invalid_request_error"}'] == "1"
    assert samples["specwire_copied_tokens_total"] == "9" and samples["specwire_copied_tokens_accepted_total"] == "3"
    assert all(line.startswith(("# HELP specwire_", "# TYPE specwire_", "specwire_")) for line in text.splitlines())


# ---- the app on a tiny target --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def draft(tiny_llama_target, tmp_path_factory):
    return load_engine_draft(make_draft_dir(tiny_llama_target, tmp_path_factory.mktemp("serve-draft") / "d"),
                             tiny_llama_target)


def _client(target, draft, mode):
    from fastapi.testclient import TestClient

    spec = SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=5, tree=mode == "tree")
    client = TestClient(create_app(target, None if mode == "plain" else draft, spec=spec, model_name=MODEL))
    client.mode = mode
    return client


@pytest.fixture(scope="module", params=["tree", "chain", "plain"])
def client(request, tiny_llama_target, draft):
    with _client(tiny_llama_target, draft, request.param) as c:
        yield c


def _plain_text(target, prompt_ids, n):
    ref = plain_generate(target, prompt_ids, max_new_tokens=n)
    return target.tokenizer.decode(ref.output_ids, skip_special_tokens=True), ref


def _stream(client, path, body):
    events = []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


PROMPT = "The quick brown fox"


def test_completions_are_lossless_against_plain_greedy(client, tiny_llama_target):
    t = tiny_llama_target
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    text, ref = _plain_text(t, t.tokenizer(PROMPT)["input_ids"], 12)
    assert out["object"] == "text_completion" and out["model"] == MODEL
    assert out["choices"][0]["text"] == text
    assert out["choices"][0]["finish_reason"] == ("stop" if ref.stop_reason == "eos" else "length")
    assert out["usage"] == {"prompt_tokens": len(ref.prompt_ids), "completion_tokens": len(ref.output_ids),
                            "total_tokens": len(ref.prompt_ids) + len(ref.output_ids)}
    ext = out["specwire"]
    assert ext["mode"] == client.mode
    if client.mode == "plain":
        assert ext["accept_length"] is None
    else:
        assert ext["accept_length"] >= 1.0 and ext["num_verify_passes"] >= 1 and ext["tree"] == (client.mode == "tree")
    # token ids as the prompt give the same answer
    r2 = client.post("/v1/completions", json={"prompt": ref.prompt_ids, "max_tokens": 12})
    assert r2.json()["choices"][0]["text"] == text


def test_chat_completions_are_lossless_and_streaming_matches(client, tiny_llama_target):
    t = tiny_llama_target
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 10}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    text, ref = _plain_text(t, t.encode_chat(messages), 10)
    msg = out["choices"][0]["message"]
    assert out["object"] == "chat.completion" and msg == {"role": "assistant", "content": text}
    assert out["usage"]["completion_tokens"] == len(ref.output_ids)

    chunks = _stream(client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == text
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1
    assert finals[0]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == out["usage"]


def test_streamed_completion_equals_non_streamed(client):
    body = {"prompt": "Once upon a time", "max_tokens": 12}
    full = client.post("/v1/completions", json=body).json()
    chunks = _stream(client, "/v1/completions", body)
    assert len(chunks) >= 2  # text arrives in pieces, then the finish chunk
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert chunks[-1]["specwire"]["mode"] == client.mode
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage


def test_stop_string_cuts_the_text_in_both_modes(client, tiny_llama_target):
    t = tiny_llama_target
    ids = t.tokenizer(PROMPT)["input_ids"]
    text, _ = _plain_text(t, ids, 24)
    # an ASCII pair from the middle of the greedy answer, as the stop string
    i = next(i for i in range(4, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isprintable())
    stop = text[i:i + 2]
    expected = text[:text.find(stop)]
    body = {"prompt": PROMPT, "max_tokens": 24, "stop": [stop]}
    out = client.post("/v1/completions", json=body).json()
    assert out["choices"][0]["text"] == expected and out["choices"][0]["finish_reason"] == "stop"
    chunks = _stream(client, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected


def test_sampling_is_reproducible_with_a_seed(client):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0.9, "top_k": 50, "seed": 7}
    a, b = (client.post("/v1/completions", json=body).json() for _ in range(2))
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["specwire"]["seed"] == 7
    no_seed = client.post("/v1/completions", json={**body, "seed": None}).json()
    assert isinstance(no_seed["specwire"]["seed"], int)  # a fresh seed, reported so the answer can be redone


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10_000}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "top_p": 2}, "top_p"),
])
def test_bad_requests_get_openai_style_400(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert "Traceback" not in r.text


def test_invalid_json_unknown_model_and_unknown_route(client):
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "hi", "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]


def test_models_and_health(client, tiny_llama_target):
    data = client.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == [MODEL]
    assert data["data"][0]["specwire"]["context"] == tiny_llama_target.info.max_position_embeddings
    assert client.get("/health").json() == {"status": "ok", "model": MODEL, "mode": client.mode}


def _samples(client):
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return dict(line.rsplit(" ", 1) for line in r.text.splitlines() if line and not line.startswith("#"))


def test_metrics_count_requests_tokens_and_acceptance(client):
    before = _samples(client)
    key = 'specwire_requests_total{endpoint="completions"}'
    n0, g0 = float(before.get(key, 0)), float(before["specwire_generated_tokens_total"])
    outs = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 6}).json() for p in ("ab", "cd")]
    client.post("/v1/completions", json={"prompt": ""})
    after = _samples(client)
    assert float(after[key]) == n0 + 2
    assert float(after["specwire_generated_tokens_total"]) == g0 + sum(o["usage"]["completion_tokens"] for o in outs)
    assert float(after['specwire_request_errors_total{type="invalid_request_error"}']) >= 1
    assert float(after["specwire_last_request_tokens_per_second"]) > 0
    if client.mode == "plain":
        assert "specwire_accept_length_mean" not in after
    else:
        assert float(after["specwire_accept_length_mean"]) >= 1.0
        assert 0.0 <= float(after['specwire_accept_rate{position="0"}']) <= 1.0
        assert float(after["specwire_draft_seconds_total"]) > 0 and float(after["specwire_verify_seconds_total"]) > 0


def test_official_openai_client_talks_to_the_server(tiny_llama_target, draft):
    """The official client's completions API (its chat API needs `jiter`, which the peer install leaves out)."""
    openai = pytest.importorskip("openai")
    with _client(tiny_llama_target, draft, "tree") as client:
        _openai_checks(openai, client, tiny_llama_target)


def _openai_checks(openai, client, tiny_llama_target):
    api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client)
    text, ref = _plain_text(tiny_llama_target, tiny_llama_target.tokenizer(PROMPT)["input_ids"], 8)
    out = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
    assert out.choices[0].text == text and out.usage.completion_tokens == len(ref.output_ids)
    stream = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in stream) == text
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model=MODEL, prompt="hi", temperature=-1)
    assert e.value.param == "temperature"


def test_cli_refuses_a_bad_port_without_a_traceback(capsys):
    assert main(["serve", "--no-draft", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


@pytest.mark.slow
def test_builtin_target_chat_is_lossless_and_streams_the_same_text(tmp_path):
    """SmolLM2-135M with its real BPE tokenizer and chat template: the shipped draft when installed, else a random one."""
    from fastapi.testclient import TestClient

    from specwire.draft.checkpoint import shipped_draft_dir
    from specwire.draft.model import SHIPPED_DRAFT
    from specwire.target.load import load_target

    target = load_target("smollm2-135m", device="cpu", dtype="float32")
    path = SHIPPED_DRAFT if (shipped_draft_dir() / "config.json").is_file() else make_draft_dir(target, tmp_path / "d")
    app = create_app(target, load_engine_draft(path, target),
                     spec=SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=4), model_name=MODEL)
    messages = [{"role": "user", "content": "Name three colours, in French."}]
    text, ref = _plain_text(target, target.encode_chat(messages), 16)
    with TestClient(app) as client:
        out = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16}).json()
        chunks = _stream(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 16})
    assert text.strip() and out["choices"][0]["message"]["content"] == text and out["usage"]["completion_tokens"] == len(ref.output_ids)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text

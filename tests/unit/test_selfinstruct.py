"""`specwire selfinstruct` (Magpie): the pure filters, the user-turn prefix, and a resumable run on a tiny target."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from specwire.data.prompts import load_prompts
from specwire.data.selfinstruct import (MANIFEST, FilterConfig, NearDuplicateIndex, SelfInstructConfig, benchmark_ngrams,
                                        contamination, jaccard, read_conversations, reject_reason, repetition,
                                        run_selfinstruct, shard_name, shingles, user_turn_prefix)
from specwire.errors import SpecwireError
from specwire.safeio import read_json, write_json

F = FilterConfig()
GOOD = "Can you explain how photosynthesis turns sunlight into chemical energy in plants?"


# ---- pure functions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, finished, reason", [
    (GOOD, True, None),
    (GOOD, False, "unfinished"),
    ("Write it now", True, "too-short"),
    ("word " * 400, True, "too-long"),
    ("Explique-moi la photosynthèse, s'il te plaît, en détail et à l'école élémentaire", True, "not-english"),
    ("Supercalifragilistic antidisestablishmentarianism", True, "too-short"),  # long enough, two words
    ("Photosynthesis converts sunlight carbon dioxide water glucose oxygen", True, "not-english"),  # no common word
    ("tell me the story " * 12, True, "repetitive"),
    ("Please explain what <|im_start|> means in a chat template", True, "template-tokens"),
])
def test_reject_reason(text, finished, reason):
    assert reject_reason(text, finished=finished, f=F) == reason


def test_repetition_scores_loops_high_and_varied_text_zero():
    assert repetition(GOOD) == 0.0
    assert repetition("a b c " * 20) > 0.9
    assert repetition("two words") == 0.0  # no 3-gram at all


def test_shingles_and_jaccard():
    assert shingles("The cat sat on the mat") == {("the", "cat", "sat"), ("cat", "sat", "on"), ("sat", "on", "the"),
                                                  ("on", "the", "mat")}
    assert shingles("Hi there") == {("hi", "there")} and shingles("...") == set()
    a, b = shingles("the cat sat on the mat"), shingles("the cat sat on a mat")
    assert jaccard(a, a) == 1.0 and 0 < jaccard(a, b) < 1 and jaccard(set(), set()) == 1.0
    assert jaccard(a, shingles("completely different words here")) == 0.0


def test_near_duplicate_index_keeps_distinct_and_drops_near_duplicates():
    idx = NearDuplicateIndex(0.6, seed=0)
    base = "Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night"
    assert idx.add(base)
    assert not idx.add(base)  # exact
    assert not idx.add(base.replace("stormy", "windy"))  # one word changed: Jaccard well above 0.6
    assert not idx.add(base.upper() + "!")  # case and punctuation do not count
    assert idx.add(GOOD)
    assert idx.add("List five healthy breakfast ideas for a busy student who has only ten minutes each morning")
    assert not idx.add("???")  # no words: nothing to compare, never kept
    other = NearDuplicateIndex(0.6, seed=0)  # the index is deterministic given its seed
    assert [other.add(t) for t in (base, GOOD, base + " again")] == [True, True, False]


def test_contamination_finds_a_benchmark_ngram():
    grams = benchmark_ngrams(8)
    mt = load_prompts("mt-bench")[0]
    words = mt.first_user_turn.split()
    leaked = "I was wondering: " + " ".join(words[2:12]) + " -- could you help?"
    assert contamination(leaked, grams, 8) == f"mt-bench:{mt.id.split(':')[1]} turn 1"
    assert contamination(GOOD, grams, 8) is None
    assert contamination("def has_close_elements(numbers: List[float], threshold: float) -> bool: Check if in "
                         "given list of numbers, are any two numbers closer to each other than given threshold.",
                         grams, 8) == "HumanEval/0"


# ---- the target's side ------------------------------------------------------------------------------

def test_user_turn_prefix_stops_where_the_user_text_begins(tiny_llama_target):
    t = tiny_llama_target
    prefix = user_turn_prefix(t)
    assert t.tokenizer.decode(prefix) == "<|im_start|>user\n"
    full = t.encode_chat([{"role": "user", "content": "hello"}], add_generation_prompt=False)
    assert full[:len(prefix)] == prefix


def test_user_turn_prefix_opens_with_a_given_system_message(tiny_llama_target):
    t = tiny_llama_target
    system = "You are an expert Python programmer."
    prefix = user_turn_prefix(t, system)
    assert t.tokenizer.decode(prefix) == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
    full = t.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "hello"}],
                         add_generation_prompt=False)
    assert full[:len(prefix)] == prefix


def test_user_turn_prefix_refuses_a_template_that_drops_the_system_message(tiny_llama_target):
    import copy

    tok = copy.deepcopy(tiny_llama_target.tokenizer)
    tok.chat_template = "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}" \
                        "<|im_end|>\n{% endif %}{% endfor %}"
    t = dataclasses.replace(tiny_llama_target, tokenizer=tok)
    assert tok.decode(user_turn_prefix(t)) == "<|im_start|>user\n"
    with pytest.raises(SpecwireError, match="drops a system message"):
        user_turn_prefix(t, "You write Python.")


def test_user_turn_prefix_needs_a_chat_template(tiny_llama_target):
    no_template = dataclasses.replace(tiny_llama_target, tokenizer=_without_template(tiny_llama_target.tokenizer))
    with pytest.raises(SpecwireError, match="no chat template"):
        user_turn_prefix(no_template)


def _without_template(tok):
    import copy

    tok = copy.deepcopy(tok)
    tok.chat_template = None
    return tok


# ---- a whole run, resumed -----------------------------------------------------------------------------

# A random tiny model writes byte soup: loose filters so that some of it is kept (the filters are tested above).
LOOSE = FilterConfig(min_chars=1, min_words=1, min_ascii=0.0, min_common_words=0, max_repetition=1.0)
SMALL = dict(conversations=6, shard_size=3, sample_batch=8, answer_batch=4, max_request_tokens=48, max_new_tokens=8,
             progress=False)


def _records(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _without_timings(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("sample_seconds", "answer_seconds")}


def test_run_then_resume_regenerates_the_last_shard_identically(tiny_llama_target, tiny_target, tmp_path):
    t = tiny_llama_target
    out = tmp_path / "si"
    cfg = SelfInstructConfig(out=str(out), target=str(tiny_target("llama")), filters=LOOSE, **SMALL)
    res = run_selfinstruct(cfg, target=t)
    assert res.conversations == 6 and res.shards == 2 and len(res.new_shards) == 2
    manifest = read_json(out / MANIFEST)
    assert manifest["format"] == "specwire-selfinstruct" and manifest["options"] == cfg.options()
    for s in manifest["shards"]:
        # every sampled request is rejected (with a reason), kept, or kept only in the duplicate index
        assert s["sampled"] == sum(s["rejected"].values()) + s["conversations"] + len(s["dedup_only"])
    convs = read_conversations(out)
    assert [r["index"] for r in convs] == list(range(6)) and len({r["id"] for r in convs}) == 6
    prefix_len = len(user_turn_prefix(t))
    for r in convs:
        user, answer = r["messages"]
        assert user["role"] == "user" and answer["role"] == "assistant" and r["source"] == "selfinstruct"
        prompt = t.encode_chat([user])
        n = len(prompt)
        assert r["input_ids"][:n] == prompt and r["loss_mask"] == [0] * n + [1] * (len(r["input_ids"]) - n)
        assert r["input_ids"][:prefix_len] == user_turn_prefix(t)
        assert 1 <= len(r["input_ids"]) - n <= 8 and r["finish"] in ("eos", "length")

    last = out / shard_name(1)
    first_records, last_records = _records(out / shard_name(0)), _records(last)
    last_bytes = last.read_bytes()
    entry = manifest["shards"][1]
    write_json(out / MANIFEST, {**manifest, "shards": manifest["shards"][:1]})  # as if killed before listing it
    again = run_selfinstruct(cfg, target=t)
    assert again.conversations == 6 and [s.shard for s in again.new_shards] == [1]
    assert _records(last) == last_records and _records(out / shard_name(0)) == first_records
    assert last.read_bytes() == last_bytes  # the gzip header holds no name and no time: same records, same bytes
    assert _without_timings(read_json(out / MANIFEST)["shards"][1]) == _without_timings(entry)
    assert run_selfinstruct(cfg, target=t).new_shards == []  # finished: a rerun does nothing


def test_a_system_message_steers_the_requests_but_not_the_answers(tiny_llama_target, tiny_target, tmp_path):
    t = tiny_llama_target
    system = "You are an expert Python programmer."
    base = SelfInstructConfig(out=str(tmp_path / "plain"), target=str(tiny_target("llama")), filters=LOOSE,
                              **{**SMALL, "conversations": 3})
    steered = dataclasses.replace(base, out=str(tmp_path / "steered"), system=system)
    assert "system" not in base.options() and steered.options()["system"] == system  # older manifests still match
    run_selfinstruct(base, target=t)
    run_selfinstruct(steered, target=t)
    assert read_json(tmp_path / "steered" / MANIFEST)["options"]["system"] == system
    plain, convs = read_conversations(tmp_path / "plain"), read_conversations(tmp_path / "steered")
    assert [r["messages"][0] for r in convs] != [r["messages"][0] for r in plain]  # sampled after another prefix
    for r in convs:  # answered as a user's request would be: the template's default opening, no system message
        assert r["input_ids"][:len(user_turn_prefix(t))] == user_turn_prefix(t)
        assert r["input_ids"][:len(t.encode_chat(r["messages"][:1]))] == t.encode_chat(r["messages"][:1])
        assert system not in t.tokenizer.decode(r["input_ids"])


def test_cli_refuses_a_changed_option_on_resume(tiny_llama_target, tiny_target, tmp_path, capsys):
    from specwire.cli import main

    out = tmp_path / "si"
    cfg = SelfInstructConfig(out=str(out), target=str(tiny_target("llama")), filters=LOOSE,
                             **{**SMALL, "conversations": 3})
    run_selfinstruct(cfg, target=tiny_llama_target)
    loose = ["--min-chars", "1", "--min-words", "1", "--min-ascii", "0", "--min-common-words", "0", "--max-repetition", "1"]
    common = ["selfinstruct", "--target", str(tiny_target("llama")), "--device", "cpu", "--out", str(out),
              "--shard-size", "3", "--sample-batch", "8", "--answer-batch", "4", "--max-request-tokens", "48",
              "--no-progress", *loose]
    assert main([*common, "--conversations", "3", "--max-new-tokens", "8", "--json"]) == 0  # same options: resumes
    assert json.loads(capsys.readouterr().out)["conversations"] == 3
    rc = main([*common, "--conversations", "3", "--max-new-tokens", "9"])
    err = capsys.readouterr().err
    assert rc == 2 and "another options" in err and "max_new_tokens" in err and "Traceback" not in err
    rc = main([*common, "--conversations", "3", "--max-new-tokens", "8", "--system", "You write Python."])
    err = capsys.readouterr().err
    assert rc == 2 and "differs in: system" in err and "Traceback" not in err


def test_online_training_reads_selfinstruct_folders_checked_against_the_target(tiny_llama_target, tiny_target, tmp_path):
    """`train --online` takes selfinstruct folders (several, merged); a folder made by another target is refused."""
    from specwire.errors import WiringMismatch
    from specwire.target.load import load_target
    from specwire.training.batches import load_run_data
    from specwire.training.config import TrainConfig

    out = tmp_path / "si"
    run_selfinstruct(SelfInstructConfig(out=str(out), target=str(tiny_target("llama")), filters=LOOSE,
                                        **{**SMALL, "conversations": 3}), target=tiny_llama_target)
    cfg = TrainConfig(data=[str(out), str(out)], out=str(tmp_path / "run"), online=True, progress=False)
    data = load_run_data(cfg, tiny_llama_target)
    assert len(data.train) + len(data.val) == 6 and "(selfinstruct)" in data.source
    assert int(data.vocab_counts.sum()) == 2 * sum(sum(r["loss_mask"]) for r in read_conversations(out))
    other = load_target(tiny_target("llama", seed=1), device="cpu")  # same shapes, other weights
    with pytest.raises(WiringMismatch, match="target fingerprint"):
        load_run_data(cfg, other)


def test_engine_options_may_change_between_runs_and_are_recorded_per_shard(tiny_llama_target, tiny_target, tmp_path):
    """Batching, batch sizes and dtype say how a shard is computed, not what the recipe is: a build may switch."""
    out = tmp_path / "si"
    base = dict(out=str(out), target=str(tiny_target("llama")), filters=LOOSE, **{**SMALL, "conversations": 3})
    run_selfinstruct(SelfInstructConfig(**base), target=tiny_llama_target)
    manifest = read_json(out / MANIFEST)
    # a manifest written before engines were recorded per shard listed them among the options
    manifest["options"].update(dtype="float32", sample_batch=64, answer_batch=64)
    write_json(out / MANIFEST, manifest)
    padded = SelfInstructConfig(**{**base, "conversations": 6, "batching": "padded", "answer_batch": 2,
                                   "sample_batch": 5})
    res = run_selfinstruct(padded, target=tiny_llama_target)
    assert res.conversations == 6 and [s.shard for s in res.new_shards] == [1]
    engines = [s["engine"] for s in read_json(out / MANIFEST)["shards"]]
    assert engines == [{"batching": "continuous", "sample_batch": 8, "answer_batch": 4, "dtype": "float32"},
                       {"batching": "padded", "sample_batch": 5, "answer_batch": 2, "dtype": "float32"}]


def test_continuous_and_padded_answers_are_the_same_greedy_decoding(tiny_llama_target, tiny_target, tmp_path):
    from specwire.data.selfinstruct import _answer

    requests = ["a question", "another, longer question about things", "q", "what is it?", "tell me more please"]
    cfg = SelfInstructConfig(out=str(tmp_path / "x"), target=str(tiny_target("llama")), **{**SMALL, "answer_batch": 2})
    padded = _answer(tiny_llama_target, requests, config=dataclasses.replace(cfg, batching="padded"), first_index=0)
    assert _answer(tiny_llama_target, requests, config=cfg, first_index=0) == padded


def test_bad_batching_is_named(tmp_path):
    with pytest.raises(SpecwireError, match="selfinstruct batching: 'fast', expected one of"):
        SelfInstructConfig(out=str(tmp_path), batching="fast")

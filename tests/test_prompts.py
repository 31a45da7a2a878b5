"""Prompt sources: the built-in sets, the three JSONL forms, user errors, and the training pool."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specwire.errors import SpecwireError
from specwire.prompts import (
    HUMANEVAL_INSTRUCTION,
    PromptRecord,
    build_pool,
    find_benchmark_overlap,
    load_prompts,
    main,
    normalize_text,
    pool_path,
)


@pytest.fixture(scope="module")
def pool() -> list[PromptRecord]:
    return load_prompts("pool")


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- built-in sets


def test_mt_bench_gives_80_first_turns():
    records = load_prompts("mt-bench")
    assert len(records) == 80
    assert len({r.id for r in records}) == 80
    assert all(len(r.messages) == 1 and r.messages[0]["role"] == "user" for r in records)
    assert records[0].id == "mt-bench:81" and records[0].first_user_turn.startswith("Compose an engaging travel blog")
    assert set(Counter(r.category for r in records).values()) == {10}  # 8 categories x 10


def test_humaneval_gives_164_wrapped_problems():
    records = load_prompts("humaneval")
    assert len(records) == 164
    assert records[0].id == "HumanEval/0"
    text = records[0].first_user_turn
    assert text.startswith("Complete the following Python function:\n```python\n")
    assert "def has_close_elements(" in text and text.endswith("```")


def test_limit_takes_the_first_n():
    assert [r.id for r in load_prompts("mt-bench", limit=3)] == ["mt-bench:81", "mt-bench:82", "mt-bench:83"]
    with pytest.raises(SpecwireError, match="limit"):
        load_prompts("mt-bench", limit=0)


def test_unknown_source_is_a_user_error(tmp_path):
    with pytest.raises(SpecwireError, match="neither one of mt-bench, humaneval, pool"):
        load_prompts(str(tmp_path / "nope.jsonl"))


# ----------------------------------------------------------------------------- JSONL files


def test_three_jsonl_forms_parse(tmp_path):
    path = write_lines(tmp_path / "mine.jsonl", [
        json.dumps({"prompt": "Say hi."}),
        "",  # blank lines are skipped
        json.dumps({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "First question?"},
            {"role": "assistant", "content": "An answer the target will rewrite."},
            {"role": "user", "content": "Second question?"},
        ], "id": "x1", "source": "handmade"}),
        json.dumps({"conversations": [
            {"from": "human", "value": "ShareGPT question?"}, {"from": "gpt", "value": "old answer"}]}),
        json.dumps({"conversations": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "Role/content inside conversations"}]}),
    ])
    records = load_prompts(path)
    assert [r.first_user_turn for r in records] == [
        "Say hi.", "First question?", "ShareGPT question?", "Role/content inside conversations"]
    # Multi-turn inputs stop at the first user turn (the target rewrites the assistant turns).
    assert records[1].messages == ({"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "First question?"})
    assert records[2].messages == ({"role": "user", "content": "ShareGPT question?"},)
    assert (records[0].id, records[0].source) == ("mine:1", "mine")  # default id names the line
    assert (records[1].id, records[1].source) == ("x1", "handmade")
    assert records[3].id == "mine:5"


@pytest.mark.parametrize("bad_line, expected", [
    ("{not json", "invalid JSON"),
    (json.dumps({"text": "hi"}), "expected one of"),
    (json.dumps(["a list"]), "expected a JSON object"),
    (json.dumps({"prompt": 3}), "'prompt' to be a string"),
    (json.dumps({"prompt": "   "}), "non-empty 'prompt'"),
    (json.dumps({"messages": []}), "non-empty list of turns"),
    (json.dumps({"messages": [{"role": "assistant", "content": "only me"}]}), "at least one user turn"),
    (json.dumps({"conversations": [{"from": "alien", "value": "hi"}]}), "expected a role"),
    (json.dumps({"conversations": [{"from": "human", "value": None}]}), "as a string"),
    (json.dumps({"prompt": "ok", "id": ["x"]}), "'id' to be a string"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, expected):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"prompt": "fine"}), bad_line])
    with pytest.raises(SpecwireError) as err:
        load_prompts(path)
    message = str(err.value)
    assert f"{path}, line 2" in message and expected in message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(SpecwireError, match="empty file"):
        load_prompts(path)


# ----------------------------------------------------------------------------- the training pool


def test_pool_is_large_unique_and_well_formed(pool):
    assert len(pool) >= 5000
    assert pool_path().parent.name == "pool"  # read from inside the package
    assert len({r.id for r in pool}) == len(pool)
    assert len({normalize_text(r.first_user_turn) for r in pool}) == len(pool)
    assert all(0 < len(r.first_user_turn) <= 1500 for r in pool)
    assert all(len(r.messages) == 1 for r in pool)


def test_pool_shares_nothing_with_mt_bench_or_humaneval(pool):
    assert find_benchmark_overlap(r.first_user_turn for r in pool) == []


def test_overlap_check_catches_planted_leaks():
    mt = load_prompts("mt-bench")[5].first_user_turn
    he = load_prompts("humaneval")[7].first_user_turn
    texts = [
        "An innocent prompt about sonnets.",
        "Please answer: " + mt.upper().replace(",", " ;"),  # case and punctuation do not hide it
        "Here is some code.\n" + he,
        "def add_callback(self, fn):",  # a shared word is not a leak
    ]
    hits = find_benchmark_overlap(texts)
    assert {i for i, _ in hits} == {1, 2}


def test_pool_mixes_code_chat_and_reasoning(pool):
    categories = Counter(r.category for r in pool)
    assert set(categories) == {"code", "chat", "reasoning"}
    assert all(n >= 0.15 * len(pool) for n in categories.values()), categories
    families = Counter(r.source.split(":")[0] for r in pool)
    assert {"bigbench", "stdlib", "shakespeare"} <= set(families)
    # HumanEval-form completions from stdlib code are part of the code share.
    assert sum(r.first_user_turn.startswith(HUMANEVAL_INSTRUCTION.split("{")[0]) for r in pool) >= 500
    # The stored order is shuffled, so a prefix is a mixed sample too.
    assert set(Counter(r.category for r in pool[:300])) == {"code", "chat", "reasoning"}


def test_build_pool_is_deterministic(tmp_path):
    stdlib = tmp_path / "lib"
    stdlib.mkdir()
    (stdlib / "shapes.py").write_text(
        '"""Small geometry helpers for the test."""\n\n'
        + "".join(
            f'def area_{i}(width, height):\n    """Return the area of rectangle number {i} in square units."""\n'
            f"    w = width * {i + 1}\n    h = height\n    return w * h\n\n"
            for i in range(6)
        )
    )
    a = build_pool(tmp_path / "a.jsonl.gz", seed=3, sources={"stdlib": stdlib})
    b = build_pool(tmp_path / "b.jsonl.gz", seed=3, sources={"stdlib": stdlib})
    assert a.total == 7 and a.by_family == {"stdlib": 7}  # 6 functions + the module overview
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    assert len(load_prompts(tmp_path / "a.jsonl.gz")) == 7
    with pytest.raises(SpecwireError, match="expected an sdist path"):
        build_pool(tmp_path / "c.jsonl", sources={"bigbench": tmp_path / "missing"})


def test_cli_stats(capsys):
    assert main(["stats", "mt-bench"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 80
    assert main(["stats", "/does/not/exist.jsonl"]) == 2

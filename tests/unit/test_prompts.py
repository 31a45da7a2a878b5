"""Prompt sources: the built-in sets, the three JSONL forms, user errors, and the training pool."""

from __future__ import annotations

import datetime
import gzip
import itertools
import json
import random
import re
from collections import Counter

import pytest

from specwire.errors import SpecwireError
from specwire.data.prompts import (
    HUMANEVAL_INSTRUCTION,
    PromptRecord,
    find_benchmark_overlap,
    load_prompts,
    normalize_text,
    one_per_category,
    pool_path,
)


def _load_build_pool_tool():
    """tools/build_pool.py, the one-off builder of the shipped pool (a script, not part of the package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "build_pool.py"
    spec = importlib.util.spec_from_file_location("build_pool", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


_tool = _load_build_pool_tool()
SYNTHETIC_PER_KIND = _tool.SYNTHETIC_PER_KIND
build_pool, main = _tool.build_pool, _tool.main
make_ordering_puzzle, make_truth_puzzle = _tool.make_ordering_puzzle, _tool.make_truth_puzzle


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


def test_spread_mt_bench_takes_the_categories_in_turn():
    """`mt-bench:spread` (the demo's sample): the same 80 prompts, the eight categories in turn, so the first 8 are
    one of each; within a category the stored order is kept."""
    spread, stored = load_prompts("mt-bench:spread"), load_prompts("mt-bench")
    assert sorted(r.id for r in spread) == sorted(r.id for r in stored)
    assert len({r.category for r in spread[:8]}) == 8 and spread[8].category == spread[0].category
    assert [r.id for r in load_prompts("mt-bench:spread", limit=3)] == ["mt-bench:81", "mt-bench:91", "mt-bench:101"]


def test_one_per_category_drops_a_category_that_runs_out():
    recs = [PromptRecord(messages=({"role": "user", "content": str(i)},), id=str(i), source="x", category=c)
            for i, c in enumerate("aaabbc")]
    assert [r.id for r in one_per_category(recs)] == ["0", "3", "5", "1", "4", "2"]
    assert one_per_category([]) == []


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


def test_pool_parts_select_by_source_prefix_and_slice(pool):
    synthetic = load_prompts("pool:synthetic")
    assert synthetic and all(r.source.startswith("synthetic") for r in synthetic)
    assert [r.id for r in synthetic] == [r.id for r in pool if r.source.startswith("synthetic")]  # stored order
    both = load_prompts("pool:stdlib,milton")
    assert {r.source.split(":")[0] for r in both} == {"stdlib", "milton"}
    assert [r.id for r in load_prompts("pool[512:1000]")] == [r.id for r in pool[512:1000]]
    assert [r.id for r in load_prompts("pool:synthetic[:5]")] == [r.id for r in synthetic[:5]]
    assert [r.id for r in load_prompts("pool[7800:]")] == [r.id for r in pool[7800:]]
    # disjoint parts: what `make draft` relies on to merge dumps without repeating a prompt
    assert not {r.id for r in load_prompts("pool[:512]")} & {r.id for r in synthetic + load_prompts("pool[512:1000]")}


@pytest.mark.parametrize("spec, expected", [
    ("pool:nothing", "no pool prompt's source starts with nothing; the pool's sources are milton, shakespeare"),
    ("pool[20000:]", "the slice is empty"),
    ("pool[a:b]", "expected 'pool', 'pool:PREFIX"),
])
def test_bad_pool_part_is_a_clear_error(spec, expected):
    with pytest.raises(SpecwireError, match=re.escape(expected)):
        load_prompts(spec)


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
    assert all(n >= 0.10 * len(pool) for n in categories.values()), categories
    families = Counter(r.source.split(":")[0] for r in pool)
    assert {"stdlib", "shakespeare", "milton", "synthetic"} <= set(families)
    assert "bigbench" not in families  # its canary asks to keep it out of training data (docs/PROMPT_POOL.md)
    # HumanEval-form completions from stdlib code are part of the code share.
    assert sum(r.first_user_turn.startswith(HUMANEVAL_INSTRUCTION.split("{")[0]) for r in pool) >= 500
    # The stored order is shuffled, so a prefix is a mixed sample too.
    assert set(Counter(r.category for r in pool[:300])) == {"code", "chat", "reasoning"}


def tiny_stdlib(tmp_path):
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
    return stdlib


def test_build_pool_is_deterministic(tmp_path):
    stdlib = tiny_stdlib(tmp_path)
    a = build_pool(tmp_path / "a.jsonl.gz", seed=3, sources={"stdlib": stdlib})
    b = build_pool(tmp_path / "b.jsonl.gz", seed=3, sources={"stdlib": stdlib})
    assert a.total == 7 and a.by_family == {"stdlib": 7}  # 6 functions + the module overview
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    assert len(load_prompts(tmp_path / "a.jsonl.gz")) == 7
    with pytest.raises(SpecwireError, match="expected an sdist path"):
        build_pool(tmp_path / "c.jsonl", sources={"bigbench": tmp_path / "missing"})


def pool_lines(path):
    return gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def test_synthetic_block_is_appended_after_the_other_sources(tmp_path):
    # Datagen jobs index the pool by position, so adding the synthetic block must leave every
    # earlier record byte-identical and in place.
    stdlib = tiny_stdlib(tmp_path)
    base = build_pool(tmp_path / "base.jsonl.gz", seed=3, sources={"stdlib": stdlib})
    full = build_pool(tmp_path / "full.jsonl.gz", seed=3, sources={"stdlib": stdlib, "synthetic": None})
    again = build_pool(tmp_path / "again.jsonl.gz", seed=3, sources={"synthetic": None, "stdlib": stdlib})
    assert (tmp_path / "full.jsonl.gz").read_bytes() == (tmp_path / "again.jsonl.gz").read_bytes()
    old, new = pool_lines(tmp_path / "base.jsonl.gz"), pool_lines(tmp_path / "full.jsonl.gz")
    assert new[:len(old)] == old and len(old) == base.total == 7
    records = load_prompts(tmp_path / "full.jsonl.gz")
    synthetic = [i for i, r in enumerate(records) if r.source.startswith("synthetic:")]
    assert synthetic == list(range(base.total, full.total))  # all synthetic ids come after all others
    assert full.by_family["synthetic"] == full.total - base.total == again.total - base.total
    assert full.by_family["synthetic"] >= 20 * SYNTHETIC_PER_KIND
    assert {records[i].category for i in synthetic} == {"reasoning", "chat"}
    # The block is shuffled on its own: its start mixes kinds rather than running one kind after another.
    assert len({records[i].source for i in synthetic[:30]}) >= 10
    other_seed = build_pool(tmp_path / "seed4.jsonl", seed=4, sources={"synthetic": None})
    texts = {r.first_user_turn for r in records[base.total:]}
    assert other_seed.total == full.by_family["synthetic"]
    assert len(texts & {r.first_user_turn for r in load_prompts(tmp_path / "seed4.jsonl")}) < 0.3 * len(texts)
    with pytest.raises(SpecwireError, match="'synthetic' takes no input"):
        build_pool(tmp_path / "x.jsonl", sources={"synthetic": "some/path"})


def test_shipped_pool_keeps_synthetic_prompts_last(pool):
    synthetic = [i for i, r in enumerate(pool) if r.source.startswith("synthetic:")]
    assert len(synthetic) >= 1500 and synthetic == list(range(len(pool) - len(synthetic), len(pool)))
    assert Counter(pool[i].category for i in synthetic)["reasoning"] >= 1000


def test_ordering_puzzles_have_exactly_one_solution():
    holds = {  # our own reading of each clue kind, against an order (first place first)
        "before": lambda o, x, y: o.index(x) < o.index(y),
        "next": lambda o, x, y: o.index(y) == o.index(x) + 1,
        "gap1": lambda o, x, y: abs(o.index(x) - o.index(y)) == 2,
        "pos": lambda o, x, k: o.index(x) == k,
        "notpos": lambda o, x, k: o.index(x) != k,
    }
    for seed in range(150):
        puzzle = make_ordering_puzzle(random.Random(seed))
        solutions = [o for o in itertools.permutations(puzzle.people)
                     if all(holds[kind](o, a, b) for kind, a, b in puzzle.clues)]
        assert solutions == [puzzle.solution], (seed, puzzle.text)
        assert all(name in puzzle.text for name in puzzle.people)
        assert len(puzzle.text.split(". ")) >= len(puzzle.clues) + 1  # every clue is written out


def test_truth_puzzles_have_exactly_one_solution():
    def statement(clue, who, n):
        kind, args = clue[0], clue[2:]
        if kind == "is":
            return who[args[0]] == args[1]
        if kind == "same":
            return who[args[0]] == who[args[1]]
        if kind == "diff":
            return who[args[0]] != who[args[1]]
        if kind == "some-liar":
            return not (who[args[0]] and who[args[1]])
        assert kind == "count"
        return sum(who.values()) == args[0]

    for seed in range(150):
        puzzle = make_truth_puzzle(random.Random(seed))
        n = len(puzzle.people)
        solutions = []
        for honest in itertools.product((True, False), repeat=n):
            who = dict(zip(puzzle.people, honest))
            if all(statement(c, who, n) == who[c[1]] for c in puzzle.clues):  # truth-tellers say true things
                solutions.append(honest)
        assert solutions == [puzzle.solution], (seed, puzzle.text)
        assert puzzle.text.count(" says: ") == len(puzzle.clues)


def test_synthetic_calendar_premises_are_true(pool):
    months = {m: i for i, m in enumerate(("January", "February", "March", "April", "May", "June", "July", "August",
                                          "September", "October", "November", "December"), 1)}
    checked = 0
    for r in pool:
        if r.source != "synthetic:dates-times":
            continue
        m = re.search(r"(?:(\w+) (\d+), (\d{4})|(\d+) (\w+) (\d{4})|(\d{4})-(\d\d)-(\d\d)) is a (\w+day)\b",
                      r.first_user_turn)
        if m:
            g = m.groups()
            if g[0]:
                date = datetime.date(int(g[2]), months[g[0]], int(g[1]))
            elif g[3]:
                date = datetime.date(int(g[5]), months[g[4]], int(g[3]))
            else:
                date = datetime.date(int(g[6]), int(g[7]), int(g[8]))
            assert date.strftime("%A") == g[9], r.first_user_turn
            checked += 1
    assert checked >= 10


def test_cli_stats(capsys):
    assert main(["stats", "mt-bench"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 80
    assert main(["stats", "/does/not/exist.jsonl"]) == 2

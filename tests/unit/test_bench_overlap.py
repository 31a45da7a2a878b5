"""`tools/draft/bench_overlap.py`: kept self-instruct requests that share a shorter word run with a benchmark prompt."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from specwire.data.selfinstruct import FORMAT, MANIFEST, shard_name

TOOL = Path(__file__).resolve().parents[2] / "tools" / "draft" / "bench_overlap.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bench_overlap", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _build(folder: Path, requests: list[str]) -> None:
    folder.mkdir()
    with gzip.open(folder / shard_name(0), "wt", encoding="utf-8") as f:
        for i, text in enumerate(requests):
            f.write(json.dumps({"index": i, "messages": [{"role": "user", "content": text},
                                                         {"role": "assistant", "content": "ok"}]}) + "\n")
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "shards": [{"shard": 0}]}))


def test_counts_requests_sharing_a_run_by_benchmark(tmp_path, capsys):
    requests = [
        "Please write a function that takes a string and returns True if the string length is a prime number",  # HumanEval/82
        "Compose an engaging travel blog post about a recent trip to Hawaii",  # MT-bench's first question
        "Tell me how bread dough rises overnight in a cold kitchen",  # neither
    ]
    _build(tmp_path / "si", requests)
    assert _tool().main([str(tmp_path / "si"), "--ngrams", "6", "--top", "2"]) == 0
    out = json.loads(capsys.readouterr().out)["builds"][0]
    six = out["by_ngram"]["6"]
    assert out["requests"] == 3 and six["requests"] == 2 and six["humaneval"] == 1 and six["mt-bench"] == 1
    assert len(six["most_common"]) == 2 and all(n == 1 for _, n in six["most_common"])

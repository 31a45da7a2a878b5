"""How close self-instruct requests come to the held-out benchmark prompts, below the build's own filter.

    python tools/draft/bench_overlap.py tools/draft/data/selfinstruct-code --ngrams 6 5

A build drops every request that shares a word run of its `contamination_ngram` (8) with an MT-bench or
HumanEval prompt. This counts, for shorter runs, the kept requests that share one, by benchmark, and the most
frequent shared runs: phrasing every request of its kind uses ("write a function that takes a") is not a leaked
problem. Uses the build's own word split and n-gram index (`data.selfinstruct`). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json

from specwire.data.selfinstruct import benchmark_ngrams, read_requests, shared_ngram


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="self-instruct folders")
    ap.add_argument("--ngrams", type=int, nargs="+", default=[6, 5], help="run lengths in words (default: 6 5)")
    ap.add_argument("--top", type=int, default=5, help="most frequent shared runs listed (default: 5)")
    args = ap.parse_args(argv)
    result = []
    for folder in args.builds:
        requests = read_requests(folder)
        entry = {"folder": folder, "requests": len(requests), "by_ngram": {}}
        for n in args.ngrams:
            grams = benchmark_ngrams(n)
            by_set, runs = collections.Counter(), collections.Counter()
            for text in requests:
                hit = shared_ngram(text, grams, n)
                if hit is not None:
                    by_set["humaneval" if grams[hit].startswith("HumanEval") else "mt-bench"] += 1
                    runs[" ".join(hit)] += 1
            entry["by_ngram"][str(n)] = {"requests": sum(by_set.values()), **by_set,
                                         "most_common": runs.most_common(args.top)}
        result.append(entry)
    print(json.dumps({"builds": result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

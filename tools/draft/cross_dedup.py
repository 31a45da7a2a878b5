"""Near-duplicate user requests between self-instruct builds, which each deduplicate only within themselves.

    python tools/draft/cross_dedup.py tools/draft/data/selfinstruct tools/draft/data/selfinstruct-s1

Every request of the first build goes into one MinHash index (`data.selfinstruct.NearDuplicateIndex`, the
build's own, at the threshold its manifest records); each request of a later build is then counted as a
near duplicate when the index already holds one within that threshold. A build's own requests are already
unique at that threshold, so the count is the overlap between builds. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specwire.data.selfinstruct import MANIFEST, NearDuplicateIndex, read_requests
from specwire.safeio import read_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="self-instruct folders; the first is the reference")
    args = ap.parse_args(argv)
    threshold = read_json(Path(args.builds[0]) / MANIFEST, what="self-instruct manifest")["options"]["filters"]["near_duplicate"]
    index = NearDuplicateIndex(threshold)
    report = {"threshold": threshold, "builds": []}
    for k, folder in enumerate(args.builds):
        texts = read_requests(folder)
        dups = sum(not index.add(t) for t in texts)
        report["builds"].append({"folder": folder, "requests": len(texts),
                                 "near_duplicates_of_earlier_builds": dups if k else None})
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

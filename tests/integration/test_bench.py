"""`specwire bench`: summary maths (no models), rendering, and real runs on a tiny target (+ random tiny draft)."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from specwire.bench.config import DRAFT_METHODS, METHODS, BenchConfig, BenchReport, PromptRun, parse_methods
from specwire.bench.report import render_markdown, render_summary, save_plot
from specwire.bench.run import run_bench
from specwire.bench.summary import add_speedups, first_difference, summarize, summarize_by_category, weighted_positions
from specwire.decode.engine import SpecConfig
from specwire.errors import SpecwireError

from helpers import random_tiny_draft

STABLE_RESULT_KEYS = {"method", "tokens_per_s", "accept_length", "lossless"}
HF_AND_PLAIN = ("hf-generate", "hf-prompt-lookup", "plain")


def _run(method, pid, out, seconds, forwards=None, **extra):
    return PromptRun(method, pid, 5, list(out), seconds, forwards, "length", extra)


# ---- pure maths --------------------------------------------------------------------------------------

def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter output is a difference too
    assert first_difference([], []) is None


def test_weighted_positions_weights_rows_and_handles_ragged_lengths():
    rows = [[1.0, 0.5], [0.0, 0.0, 1.0]]
    out = weighted_positions(rows, [3.0, 1.0])
    assert out[0] == pytest.approx(0.75)
    assert out[1] == pytest.approx(0.375)
    assert out[2] == pytest.approx(1.0)  # only the second row reaches position 2
    assert weighted_positions([], []) == []


def test_summarize_speedups_lossless_and_draft_metrics_from_numbers():
    runs = [
        _run("plain", "a", [1, 2, 3, 4], 2.0, 4), _run("plain", "b", [5, 6], 1.0, 2),
        _run("hf-generate", "a", [1, 2, 3, 4], 4.0, 4), _run("hf-generate", "b", [5, 6], 2.0, 2),
        _run("hf-prompt-lookup", "a", [1, 2, 3, 4], 1.0, 2), _run("hf-prompt-lookup", "b", [5, 7], 1.0, 2),
        _run("eagle3-tree", "a", [1, 2, 3, 4], 1.0, 2, accept_length=3.0, num_verify_passes=1,
             accept_per_position=[1.0, 1.0, 0.0], draft_s=0.2, verify_s=0.7, other_s=0.1),
        _run("eagle3-tree", "b", [5, 6], 0.5, 2, accept_length=1.0, num_verify_passes=3,
             accept_per_position=[0.0, 0.0, 0.0], draft_s=0.1, verify_s=0.3, other_s=0.1),
    ]
    res = {r.method: r for r in summarize(runs, ["hf-generate", "hf-prompt-lookup", "plain", "eagle3-tree"])}
    assert res["plain"].tokens_per_s == pytest.approx(2.0) and res["plain"].speedup_vs_plain == pytest.approx(1.0)
    assert res["hf-generate"].tokens_per_s == pytest.approx(1.0)
    assert res["plain"].speedup_vs_hf == pytest.approx(2.0)
    tree = res["eagle3-tree"]
    assert tree.tokens_per_s == pytest.approx(4.0)
    assert tree.speedup_vs_hf == pytest.approx(4.0) and tree.speedup_vs_plain == pytest.approx(2.0)
    assert tree.accept_length == pytest.approx((3.0 * 1 + 1.0 * 3) / 4)  # weighted by verify passes
    assert tree.accept_per_position == pytest.approx([0.25, 0.25, 0.0])
    assert tree.time_split == pytest.approx({"draft_s": 0.3, "verify_s": 1.0, "plain_s": 0.0, "other_s": 0.2,
                                             "verify_passes": 4})
    assert tree.lossless and tree.mismatches == 0
    lookup = res["hf-prompt-lookup"]
    assert not lookup.lossless and lookup.mismatches == 1
    assert lookup.first_mismatch == {"prompt_id": "b", "position": 1}
    assert lookup.accept_length is None and lookup.accept_per_position is None  # no draft model
    assert lookup.tokens_per_forward == pytest.approx(6 / 4)


def test_by_category_summarises_each_categorys_prompts_alone_and_renders_them(tmp_path):
    runs = [
        _run("plain", "w1", [1, 2], 1.0, 2), _run("plain", "w2", [3, 4], 1.0, 2), _run("plain", "m1", [5, 6, 7, 8], 1.0, 4),
        _run("plain", "x", [9], 1.0, 1),  # a prompt of no known category joins no category
        _run("eagle3-tree", "w1", [1, 2], 0.5, 2, accept_length=1.0, num_verify_passes=2, accept_counts=[0],
             reach_counts=[2]),
        _run("eagle3-tree", "w2", [3, 4], 1.5, 2, accept_length=1.0, num_verify_passes=2, accept_counts=[0],
             reach_counts=[2]),
        _run("eagle3-tree", "m1", [5, 6, 7, 8], 0.25, 1, accept_length=4.0, num_verify_passes=1, accept_counts=[1],
             reach_counts=[1]),
        _run("eagle3-tree", "x", [9], 1.0, 1, accept_length=1.0, num_verify_passes=1, accept_counts=[0], reach_counts=[1]),
    ]
    categories = {"w1": "writing", "w2": "writing", "m1": "math", "x": ""}
    by = summarize_by_category(runs, ["plain", "eagle3-tree"], categories)
    assert list(by) == ["writing", "math"]  # first-run order; "" is no category
    w, m = ({r.method: r for r in by[c]} for c in ("writing", "math"))
    assert w["plain"].tokens_per_s == pytest.approx(2.0) and w["eagle3-tree"].tokens_per_s == pytest.approx(2.0)
    assert w["eagle3-tree"].speedup_vs_plain == pytest.approx(1.0) and w["eagle3-tree"].accept_length == pytest.approx(1.0)
    assert m["eagle3-tree"].speedup_vs_plain == pytest.approx(4.0) and m["eagle3-tree"].accept_per_position == [1.0]
    assert summarize_by_category(runs, ["plain", "eagle3-tree"], {"w1": "writing", "w2": "writing"}) == {}  # one only

    cfg = BenchConfig(methods=("plain", "eagle3-tree"), max_new_tokens=4, out_dir=str(tmp_path), command="c")
    rep = BenchReport(config=cfg, results=summarize(runs, cfg.run_methods), prompt_ids=["w1", "w2", "m1", "x"],
                      machine={"device": "cpu"}, spec=None, runs=runs, categories=categories, by_category=by)
    md = render_markdown(rep)
    assert "| writing | 2 | 2.0 | 1.00x, 1.00, 0.00 |" in md and "| math | 1 | 4.0 | 4.00x, 4.00, 1.00 |" in md
    data = rep.to_dict()["by_category"]
    assert data["math"]["n_prompts"] == 1 and data["writing"]["results"][1]["speedup_vs_plain"] == pytest.approx(1.0)
    rep.by_category = {}
    assert "By prompt category" not in render_markdown(rep)


def test_positions_no_pass_reached_are_left_out_not_zero():
    """Under `--budget auto` a chain may never draft past depth 2: positions 2.. have no rate (reach 0), and the
    table and plot must not show them as an acceptance of 0."""
    runs = [_run("plain", "a", [1, 2, 3], 1.0, 3), _run("plain", "b", [4, 5], 1.0, 2),
            _run("eagle3-chain", "a", [1, 2, 3], 1.0, 2, accept_length=1.5, num_verify_passes=2,
                 accept_counts=[1, 1, 0, 0], reach_counts=[2, 1, 0, 0]),
            _run("eagle3-chain", "b", [4, 5], 1.0, 2, accept_length=1.0, num_verify_passes=2,
                 accept_counts=[0, 0, 0, 0], reach_counts=[2, 0, 0, 0])]
    (chain,) = [r for r in summarize(runs, ["plain", "eagle3-chain"]) if r.method == "eagle3-chain"]
    assert chain.accept_per_position == pytest.approx([0.25, 1.0])


def test_speedups_are_none_without_the_baseline():
    runs = [_run("plain", "a", [1, 2], 1.0, 2)]
    (plain,) = summarize(runs, ["plain"])
    assert plain.speedup_vs_hf is None and plain.speedup_vs_plain == pytest.approx(1.0)
    add_speedups([plain])
    assert plain.speedup_vs_hf is None


def test_summarize_needs_the_plain_oracle():
    with pytest.raises(SpecwireError, match="plain"):
        summarize([_run("hf-generate", "a", [1], 1.0, 1)], ["hf-generate"])


def test_parse_methods_and_config_validation():
    assert parse_methods("plain, hf-generate,plain") == ("plain", "hf-generate")
    with pytest.raises(SpecwireError, match="unknown method"):
        parse_methods("plain,eagle3")
    with pytest.raises(SpecwireError, match="max_new_tokens"):
        BenchConfig(max_new_tokens=0)
    with pytest.raises(SpecwireError, match="need a draft"):
        BenchConfig(methods=("plain", "eagle3-tree"), draft=None)
    with pytest.raises(SpecwireError, match="topk"):
        BenchConfig(spec=SpecConfig(budget="fixed", topk=0))
    c = BenchConfig(methods=("hf-generate",))
    assert c.run_methods == ("hf-generate", "plain") and not c.needs_draft


# ---- rendering (synthetic report) ------------------------------------------------------------------

def _synthetic_report(tmp_path) -> BenchReport:
    runs = [_run("plain", "a", [1, 2], 1.0, 2), _run("hf-generate", "a", [1, 2], 2.0, 2),
            _run("eagle3-chain", "a", [1, 2], 0.5, 1, accept_length=2.0, num_verify_passes=1,
                 accept_per_position=[1.0, 0.0], draft_s=0.1, verify_s=0.3, plain_s=0.4, other_s=0.1)]
    cfg = BenchConfig(methods=("hf-generate", "plain", "eagle3-chain"), max_new_tokens=2, out_dir=str(tmp_path),
                      command="specwire bench --limit 1")
    return BenchReport(config=cfg, results=summarize(runs, cfg.run_methods), prompt_ids=["a"],
                       machine={"torch": torch.__version__, "threads": 2, "cpu": "x", "device": "cpu", "dtype": "float32"},
                       spec={"num_steps": 2}, runs=runs)


def test_markdown_summary_and_plot(tmp_path):
    rep = _synthetic_report(tmp_path)
    md = render_markdown(rep)
    assert "| eagle3-chain | 4.0 | 4.00x | 2.00x | 2.00 |" in md
    assert "specwire bench --limit 1" in md and "torch" in md
    # the profile: a 500 ms round (300 verify + 100 draft + 100 other) against plain's 500 ms per token breaks
    # even at accept length 1.00; 2.5x hf-generate (1000 ms per token) needs 2.5 * 500 / 1000 = 1.25
    assert "| eagle3-chain | 300.0 | 100.0 | 100.0 | 1.00x | 1.00 | 1.25 | 2.00 |" in md
    # the plain steps `auto` took instead of rounds are shown apart and do not count in a round's cost
    assert "| 0.1 / 0.3 / 0.4 / 0.1 |" in md
    assert "plain: 500.0 ms per token; hf-generate: 1000.0 ms" in md
    assert "best: eagle3-chain at 4.0 tok/s = 4.00x hf-generate and 2.00x plain" in render_summary(rep)
    png = save_plot(rep, tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- real runs on a tiny target ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("bench-prompts") / "tiny.jsonl"
    prompts = ["hi", "Write a haiku about the sea, please.", "abc abc abc abc abc abc abc abc abc abc abc"]
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in prompts))
    return p


def _check_report_files(run_dir: Path, report: BenchReport) -> None:
    assert (run_dir / "results.md").read_text().startswith("# specwire bench")
    assert (run_dir / "results.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((run_dir / "results.json").read_text())
    assert data == json.loads(json.dumps(report.to_dict()))
    for key in ("results", "prompts", "n_prompts", "max_new_tokens"):
        assert key in data
    for row in data["results"]:
        assert STABLE_RESULT_KEYS <= set(row)


def test_run_bench_hf_and_plain_on_tiny_target(tiny_llama_target, prompt_file, tmp_path):
    torch.manual_seed(0)
    cfg = BenchConfig(target=str(tiny_llama_target.info.path), draft=None, prompts=str(prompt_file),
                      max_new_tokens=12, methods=HF_AND_PLAIN, warmup_tokens=2, out_dir=str(tmp_path / "run"),
                      progress=False)
    rep = run_bench(cfg, target=tiny_llama_target)
    assert [r.method for r in rep.results] == list(HF_AND_PLAIN)
    assert len(rep.prompt_ids) == 3 and len(rep.runs) == 9
    by = {r.method: r for r in rep.results}
    for r in rep.results:
        assert r.lossless, (r.method, r.first_mismatch)
        assert r.accept_length is None and r.time_split is None
        assert r.tokens > 0 and r.tokens_per_s == pytest.approx(r.tokens / r.seconds)
        assert r.speedup_vs_hf == pytest.approx(r.tokens_per_s / by["hf-generate"].tokens_per_s)
        assert r.speedup_vs_plain == pytest.approx(r.tokens_per_s / by["plain"].tokens_per_s)
    assert by["hf-generate"].target_forwards == by["hf-generate"].tokens  # one pass per token, prefill included
    # prompt-major order: each prompt's three methods run before the next prompt starts
    assert [r.prompt_id for r in rep.runs] == [p for p in rep.prompt_ids for _ in range(3)]
    _check_report_files(tmp_path / "run", rep)
    md = (tmp_path / "run" / "results.md").read_text()
    assert f"specwire bench --target {tiny_llama_target.info.path} --prompts {prompt_file}" in md  # reproducible command
    assert "--methods hf-generate,hf-prompt-lookup,plain" in md


def test_oracle_is_added_when_plain_is_left_out(tiny_llama_target, prompt_file):
    cfg = BenchConfig(draft=None, prompts=str(prompt_file), limit=1, max_new_tokens=4, methods=("hf-generate",),
                      warmup_tokens=0, out_dir="", progress=False)
    rep = run_bench(cfg, target=tiny_llama_target)
    assert [r.method for r in rep.results] == ["hf-generate", "plain"]
    assert rep.notes and rep.run_dir is None


def test_run_bench_all_methods_with_random_tiny_draft(tiny_llama_target, prompt_file, tmp_path):
    pytest.importorskip("specwire.decode.engine", reason="the speculative engine (specwire.decode.engine) is not installed yet")
    draft_dir = random_tiny_draft(tiny_llama_target, tmp_path / "draft")
    cfg = BenchConfig(target=str(tiny_llama_target.info.path), draft=str(draft_dir), prompts=str(prompt_file),
                      max_new_tokens=16, spec=SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=6), warmup_tokens=2,
                      out_dir=str(tmp_path / "run"), progress=False)
    rep = run_bench(cfg, target=tiny_llama_target)
    assert [r.method for r in rep.results] == list(METHODS)
    for r in rep.results:
        assert r.lossless, (r.method, r.first_mismatch)
    for m in DRAFT_METHODS:
        r = rep.result(m)
        assert r.accept_length is not None and r.accept_length >= 1.0
        assert r.accept_per_position and all(0.0 <= v <= 1.0 for v in r.accept_per_position)
        assert set(r.time_split) == {"draft_s", "verify_s", "plain_s", "other_s", "verify_passes"}
        assert r.time_split["verify_passes"] > 0
        assert r.speedup_vs_plain == pytest.approx(r.tokens_per_s / rep.result("plain").tokens_per_s)
    assert rep.spec and rep.spec["num_steps"] == 3 and rep.spec["topk"] == 2
    from specwire.decode.draft_step import draft_products
    from specwire.decode.engine import load_engine_draft

    served = draft_products(load_engine_draft(draft_dir, tiny_llama_target))  # what the draft's products ran
    assert rep.machine["draft_products"] == served and f"- draft_products: {served}" in render_markdown(rep)
    _check_report_files(tmp_path / "run", rep)


def test_copied_tokens_are_counted_and_reported(tiny_llama_target, prompt_file, tmp_path):
    """The tiny target's greedy answers loop, so the lookup copies and the report says what it gave: its counts are
    the sums of the requests' own, the accept length includes them, the per-position rates do not."""
    draft_dir = random_tiny_draft(tiny_llama_target, tmp_path / "draft")
    cfg = BenchConfig(target=str(tiny_llama_target.info.path), draft=str(draft_dir), prompts=str(prompt_file),
                      max_new_tokens=24, methods=("plain", "eagle3-tree"), spec=SpecConfig(budget="fixed"),
                      warmup_tokens=0, out_dir=str(tmp_path / "run"), progress=False)
    rep = run_bench(cfg, target=tiny_llama_target)
    tree = rep.result("eagle3-tree")
    assert tree.lossless
    lines = [json.loads(line) for line in (tmp_path / "run" / "runs.jsonl").read_text().splitlines()[1:]]
    copies = [r["extra"]["lookup"] for line in lines for r in line["runs"] if r["method"] == "eagle3-tree"]
    assert len(copies) == len(rep.prompt_ids)
    assert tree.lookup == {k: sum(c[k] for c in copies) for k in ("rounds", "tokens", "accepted")}
    assert tree.lookup["accepted"] > 0 and rep.result("plain").lookup is None
    line = f"{tree.lookup['rounds']} rounds verified {tree.lookup['tokens']} copied tokens; {tree.lookup['accepted']} accepted"
    assert line in render_summary(rep) and line in render_markdown(rep)
    assert "context lookup (up to 8 copied tokens a round)" in render_summary(rep)
    assert rep.spec["lookup"] == 8


def test_cli_bench_json(tiny_llama_target, prompt_file, tmp_path):
    from specwire.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["bench", "--target", str(tiny_llama_target.info.path), "--prompts", str(prompt_file),
                   "--limit", "2", "--max-new-tokens", "6", "--methods", "hf-generate,plain", "--device", "cpu",
                   "--warmup-tokens", "0", "--out", str(tmp_path / "cli"), "--no-progress", "--json"])
    assert rc == 0
    data = json.loads(buf.getvalue())
    assert data["n_prompts"] == 2 and data["max_new_tokens"] == 6 and data["prompts"] == str(prompt_file)
    assert [r["method"] for r in data["results"]] == ["hf-generate", "plain"]
    assert all(STABLE_RESULT_KEYS <= set(r) and r["accept_length"] is None for r in data["results"])
    assert (tmp_path / "cli" / "results.md").is_file()


def test_cli_bench_bad_method_is_a_one_line_error(capsys):
    from specwire.cli import main

    assert main(["bench", "--methods", "plain,warp-drive", "--json"]) == 2
    err = capsys.readouterr().err
    assert "warp-drive" in err and err.count("\n") == 1


# ---- the built-in target ------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_builtin_target_mt_bench(tmp_path):
    from specwire.draft.checkpoint import shipped_draft_dir

    methods = ["hf-generate", "plain"]
    try:
        import specwire.decode.engine  # noqa: F401

        if (shipped_draft_dir() / "config.json").is_file():
            methods += ["eagle3-chain", "eagle3-tree"]
    except ImportError:
        pass
    cfg = BenchConfig(prompts="mt-bench", limit=2, max_new_tokens=24, methods=tuple(methods), device="cpu",
                      warmup_tokens=2, out_dir=str(tmp_path / "run"), progress=False)
    rep = run_bench(cfg)
    assert [r.method for r in rep.results] == methods
    # every method on the shared (batch-invariant) kernels equals plain greedy; hf-generate runs transformers' own
    # kernels, whose bf16 greedy may break an exact tie the other way (docs/BENCHMARKS.md), so it is not held to it
    ours = [r for r in rep.results if r.method != "hf-generate"]
    assert all(r.lossless for r in ours), [(r.method, r.first_mismatch) for r in ours]
    assert all(math.isfinite(r.tokens_per_s) and r.tokens_per_s > 0 for r in rep.results)
    _check_report_files(tmp_path / "run", rep)


def test_per_position_acceptance_uses_the_engines_raw_counts():
    runs = [_run("plain", "a", [1, 2, 3], 1.0, 3), _run("plain", "b", [4, 5], 1.0, 2),
            _run("eagle3-chain", "a", [1, 2, 3], 1.0, 2, accept_length=1.5, num_verify_passes=2,
                 accept_counts=[1, 0], reach_counts=[2, 1], accept_per_position=[0.5, 0.0]),
            _run("eagle3-chain", "b", [4, 5], 1.0, 2, accept_length=2.0, num_verify_passes=1,
                 accept_counts=[1, 1], reach_counts=[1, 1], accept_per_position=[1.0, 1.0])]
    (_, chain) = summarize(runs, ["plain", "eagle3-chain"])
    assert chain.accept_per_position == pytest.approx([2 / 3, 1 / 2])  # pooled counts, not a mean of rates
    assert chain.accept_length == pytest.approx((1.5 * 2 + 2.0) / 3)


# ---- specwire demo (on a tiny target, so it runs in seconds) -------------------------------------------

def _demo(argv) -> str:
    from specwire.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["demo", "--device", "cpu", "--max-new-tokens", "4", "--bench-prompts", "1", "--bench-tokens", "4",
                     *argv]) == 0
    return buf.getvalue()


def test_demo_without_a_fitting_shipped_draft_decodes_plainly(tiny_llama_target, tmp_path):
    # The shipped draft is either not installed or made for the built-in target: either way it cannot serve this one.
    out = _demo(["--target", str(tiny_llama_target.info.path), "--out", str(tmp_path / "demo")])
    assert "default EAGLE-3 wiring" in out  # the wiring table stays
    assert "decoding plainly" in out and ("no shipped draft is installed" in out or "does not fit" in out)
    assert "| hf-generate |" in out and "| plain |" in out and "eagle3" not in out.split("benchmark:")[1]
    assert (tmp_path / "demo" / "results.json").is_file()


def test_demo_with_a_draft_streams_speculatively_and_benchmarks_it(tiny_llama_target, tmp_path):
    pytest.importorskip("specwire.decode.engine", reason="the speculative engine (specwire.decode.engine) is not installed yet")
    draft_dir = random_tiny_draft(tiny_llama_target, tmp_path / "draft")
    out = _demo(["--target", str(tiny_llama_target.info.path), "--draft", str(draft_dir), "--out", str(tmp_path / "demo")])
    assert "tree speculation" in out and "accept length" in out
    for m in ("hf-generate", "plain", "eagle3-chain", "eagle3-tree"):
        assert f"| {m} |" in out
    assert "x hf-generate and " in out and "x plain" in out  # the speed-up sentence names both baselines
    data = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert all(r["lossless"] for r in data["results"])


def test_a_prompt_past_the_context_is_refused_before_timing(tiny_llama_target, tmp_path):
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"prompt": "x" * 300}) + "\n")  # 300 byte tokens > 256 positions of the tiny target
    cfg = BenchConfig(draft=None, prompts=str(p), max_new_tokens=8, methods=("plain",), warmup_tokens=0, out_dir="",
                      progress=False)
    with pytest.raises(SpecwireError, match="long:1.*max_position_embeddings"):
        run_bench(cfg, target=tiny_llama_target)


# ---- resuming an interrupted run (benchlog) -------------------------------------------------------------

def _resumable(tiny_llama_target, prompt_file, out: Path, **kw) -> BenchConfig:
    base = dict(target=str(tiny_llama_target.info.path), draft=None, prompts=str(prompt_file), max_new_tokens=8,
                methods=("hf-generate", "plain"), warmup_tokens=0, out_dir=str(out), progress=False)
    return BenchConfig(**{**base, **kw})


def _crash_plain_on_call(monkeypatch, n: int) -> None:
    """Make `plain` raise KeyboardInterrupt on its n-th call (as a Ctrl-C in the middle of a run would)."""
    import specwire.bench.run as bench

    real = bench._plain_runner

    def crashing(target):
        run, calls = real(target), [0]

        def wrapped(ids, max_new_tokens):
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt
            return run(ids, max_new_tokens)

        return wrapped

    monkeypatch.setattr(bench, "_plain_runner", crashing)


def test_an_interrupted_bench_resumes_whole_prompts(tiny_llama_target, prompt_file, tmp_path, monkeypatch):
    from specwire.bench.record import RUNS_FILE

    out = tmp_path / "run"
    cfg = _resumable(tiny_llama_target, prompt_file, out)
    with monkeypatch.context() as m:
        _crash_plain_on_call(m, 2)  # plain's 2nd call = prompt 2: prompt 1 is finished, prompt 2 half-measured
        with pytest.raises(KeyboardInterrupt):
            run_bench(cfg, target=tiny_llama_target)
    lines = (out / RUNS_FILE).read_text().splitlines()
    assert len(lines) == 2 and not (out / "results.json").exists()  # header + the one finished prompt
    first = json.loads(lines[1])
    with open(out / RUNS_FILE, "ab") as f:  # a crash in the middle of an append leaves half a line
        f.write(b'{"prompt_id":"tiny-1","ru')

    rep = run_bench(cfg, target=tiny_llama_target)
    assert len(rep.prompt_ids) == 3 and len(rep.runs) == 6
    assert all(r.lossless for r in rep.results)
    day = first["measured_at"][:10]
    assert any(n.startswith(f"resumed: 1 of 3 prompts were measured by an earlier invocation on {day}, on a machine ")
               for n in rep.notes)
    recorded = {r["method"]: r for r in first["runs"]}
    for run in rep.runs[:2]:  # the finished prompt is taken from the record, not measured again
        assert run.prompt_id == first["prompt_id"] and run.seconds == recorded[run.method]["seconds"]
        assert run.output_ids == recorded[run.method]["output_ids"]
    lines = (out / RUNS_FILE).read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x) for x in lines)  # the half line was cut, two prompts appended
    assert json.loads((out / "results.json").read_text())["n_prompts"] == 3


def test_a_larger_limit_extends_a_finished_run_and_fresh_measures_again(tiny_llama_target, prompt_file, tmp_path):
    from specwire.bench.record import RUNS_FILE

    out = tmp_path / "run"
    first = run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=1), target=tiny_llama_target)
    assert not any(n.startswith("resumed") for n in first.notes)
    path = out / RUNS_FILE  # a record written before lines were stamped still resumes, without dates
    path.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "measured_at"}) + "\n"
                            for x in path.read_text().splitlines()))
    more = run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=2), target=tiny_llama_target)
    assert len(more.prompt_ids) == 2 and any(n.startswith("resumed: 1 of 2 prompts were measured by an earlier "
                                                          "invocation, on a machine with") for n in more.notes)
    assert [r.seconds for r in more.runs[:2]] == [r.seconds for r in first.runs]
    again = run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=2, resume=False), target=tiny_llama_target)
    assert not any(n.startswith("resumed") for n in again.notes)
    assert [r.seconds for r in again.runs] != [r.seconds for r in more.runs]


def test_resume_refuses_other_settings_another_machine_and_a_corrupt_record(tiny_llama_target, prompt_file, tmp_path):
    from specwire.bench.record import RUNS_FILE

    out = tmp_path / "run"
    run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=1), target=tiny_llama_target)
    with pytest.raises(SpecwireError, match=r"other settings \(max_new_tokens: recorded 8, now 6\)") as e:
        run_bench(_resumable(tiny_llama_target, prompt_file, out, max_new_tokens=6), target=tiny_llama_target)
    assert "--fresh" in e.value.fix

    path = out / RUNS_FILE
    header, *rest = path.read_text().splitlines()
    h = json.loads(header)
    h["machine"]["cpu"] = "another CPU"
    path.write_text("\n".join([json.dumps(h), *rest]) + "\n")
    with pytest.raises(SpecwireError, match=r"another machine or build \(cpu: recorded 'another CPU', now .*never mixed"):
        run_bench(_resumable(tiny_llama_target, prompt_file, out), target=tiny_llama_target)
    h["machine"]["cpu"] = json.loads(header)["machine"]["cpu"]
    assert h["machine"]["kernels"]  # this machine builds the compiled kernels
    h["machine"]["kernels"] = "an older build"
    path.write_text("\n".join([json.dumps(h), *rest]) + "\n")
    with pytest.raises(SpecwireError, match=r"another machine or build \(kernels: recorded 'an older build'"):
        run_bench(_resumable(tiny_llama_target, prompt_file, out), target=tiny_llama_target)

    path.write_text(header + "\nnot json\n" + "\n".join(rest) + "\n")
    with pytest.raises(SpecwireError, match=rf"{RUNS_FILE}:2: not valid JSON"):
        run_bench(_resumable(tiny_llama_target, prompt_file, out), target=tiny_llama_target)
    path.write_text('{"prompt_id": "tiny-0", "runs": []}\n')
    with pytest.raises(SpecwireError, match=r":1: expected a header with format 'specwire-bench-runs'"):
        run_bench(_resumable(tiny_llama_target, prompt_file, out), target=tiny_llama_target)


def test_cli_rerun_of_the_same_bench_command_resumes(tiny_llama_target, prompt_file, tmp_path):
    from specwire.cli import main

    argv = ["bench", "--target", str(tiny_llama_target.info.path), "--prompts", str(prompt_file), "--limit", "1",
            "--max-new-tokens", "4", "--methods", "plain", "--device", "cpu", "--warmup-tokens", "0",
            "--out", str(tmp_path / "cli"), "--no-progress", "--json"]
    notes = []
    for extra in ([], [], ["--fresh"]):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main(argv + extra) == 0
        notes.append(json.loads(buf.getvalue())["notes"])
    assert notes[0] == [] and notes[1] and notes[1][0].startswith("resumed: 1 of 1 prompts") and notes[2] == []


def test_a_record_from_before_specconfig_with_null_knobs_still_resumes(tiny_llama_target, prompt_file, tmp_path):
    """Records written when the knobs were optional hold null for 'the engine's default': they resume as such."""
    from specwire.bench.record import RUNS_FILE

    out = tmp_path / "run"
    first = run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=1), target=tiny_llama_target)
    path = out / RUNS_FILE
    header, *rest = path.read_text().splitlines()
    h = json.loads(header)
    assert {k: h["settings"][k] for k in ("num_steps", "topk", "num_draft_tokens")} == {
        "num_steps": 5, "topk": 4, "num_draft_tokens": 16}  # today's record: the values themselves
    h["settings"].update(num_steps=None, topk=None, num_draft_tokens=None)
    path.write_text("\n".join([json.dumps(h), *rest]) + "\n")
    more = run_bench(_resumable(tiny_llama_target, prompt_file, out, limit=2), target=tiny_llama_target)
    assert any(n.startswith("resumed: 1 of 2 prompts") for n in more.notes)
    assert [r.seconds for r in more.runs[:2]] == [r.seconds for r in first.runs]
    with pytest.raises(SpecwireError, match=r"other settings \(topk: recorded 4, now 2\)"):
        run_bench(_resumable(tiny_llama_target, prompt_file, out, spec=SpecConfig(topk=2)), target=tiny_llama_target)


def test_run_demo_is_a_library_call_whose_lines_go_where_the_caller_says(tiny_llama_target, tmp_path):
    from specwire.bench.demo import DemoConfig, run_demo

    lines: list[str] = []
    report = run_demo(DemoConfig(target=str(tiny_llama_target.info.path), device="cpu", max_new_tokens=3, bench_prompts=1,
                                 bench_tokens=3, out=str(tmp_path / "demo")),
                      say=lambda *a, **kw: lines.append(" ".join(map(str, a)) + kw.get("end", "\n")))
    text = "".join(lines)
    assert "default EAGLE-3 wiring" in text and "| plain |" in text and report.result("plain").lossless
    assert report.run_dir == str(tmp_path / "demo")

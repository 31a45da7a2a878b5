"""`specwire datagen` and the dump reader, on a tiny random Llama (and once on the built-in target, slow)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specwire.target.capture import capture_batch, capture_hidden_states
from specwire.data.datagen import (DatagenConfig, plan_batches, plan_capture_batches, plan_shards, run_datagen,
                                   trim_generated)
from specwire.data.dump import MANIFEST, VAL_EVERY, is_validation, open_dump, read_conversations
from specwire.errors import SpecwireError, WiringMismatch
from specwire.decode.plain import plain_generate
from specwire.safeio import load_tensors, read_json, save_tensors, write_json
from specwire.target.load import load_target
from specwire.wiring import Wiring

PROMPTS = [
    "hello",
    "write a poem about the sea",
    "what is 2+2?",
    "explain gravity in one sentence, please, with an example",
    "tell me a joke",
    "x" * 220,  # over-long under MAX_LENGTH: skipped
    "list three colours",
    "why is the sky blue? answer briefly",
]
LONG_INDEX = 5
MAX_LENGTH = 160
OPTS = dict(max_new_tokens=12, max_length=MAX_LENGTH, batch_size=3, shard_tokens=100, progress=False)


def write_prompts(path: Path, prompts=PROMPTS) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "id": f"p{i}"}) + "\n" for i, p in enumerate(prompts)))
    return path


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")


def make_config(out, prompt_file, target_dir, **kw) -> DatagenConfig:
    return DatagenConfig(out=str(out), prompts=str(prompt_file), target=str(target_dir), **{**OPTS, **kw})


@pytest.fixture(scope="module")
def dumps(tmp_path_factory, tiny_target, tiny_llama_target, prompt_file):
    """The same prompts dumped in float32 and in bfloat16."""
    root = tmp_path_factory.mktemp("dumps")
    out = {}
    for dt in ("float32", "bfloat16"):
        cfg = make_config(root / dt, prompt_file, tiny_target("llama"), dtype_dump=dt)
        out[dt] = (cfg, run_datagen(cfg, target=tiny_llama_target))
    return out


# ---- pure planning helpers --------------------------------------------------------------------------

def test_plan_batches_sorts_within_windows_and_covers_every_index_once():
    lengths = [(i, n) for i, n in enumerate([5, 9, 1, 9, 3, 7, 2, 8])]
    plan = plan_batches(lengths, batch_size=2, sort_window=2)
    assert plan == [[1, 3], [0, 2], [7, 5], [4, 6]]  # window [0..3] longest first (ties: lower index), then [4..7]
    assert sorted(i for b in plan for i in b) == list(range(8))


def test_trim_generated():
    assert trim_generated([5, 6, 2, 7, 2], eos_ids=[2], limit=10) == ([5, 6, 2], "eos")
    assert trim_generated([5, 6, 7, 8], eos_ids=[2, 9], limit=10) == ([5, 6, 7, 8], "length")
    assert trim_generated([5, 6, 7, 2], eos_ids=[2], limit=3) == ([5, 6, 7], "length")
    assert trim_generated([9, 1], eos_ids=[2, 9], limit=3) == ([9], "eos")


def test_plan_shards_and_capture_batches():
    assert [list(r) for r in plan_shards([40, 70, 10, 10, 90, 5], shard_tokens=100)] == [[0, 1], [2, 3, 4], [5]]
    assert [list(r) for r in plan_shards([200], shard_tokens=100)] == [[0]]
    batches = plan_capture_batches([10, 50, 20, 50, 5], batch_size=2, max_tokens=100)
    assert batches == [[1, 3], [2, 0], [4]]
    assert plan_capture_batches([300, 10], batch_size=4, max_tokens=100) == [[0], [1]]


# ---- capture path ---------------------------------------------------------------------------------

def test_capture_batch_equals_unbatched_capture(tiny_llama_target):
    t = tiny_llama_target
    torch.manual_seed(0)
    seqs = [torch.randint(0, 256, (n,)).tolist() for n in (7, 19, 1, 12)]
    hs = [2, 4, 5]
    out = capture_batch(t, seqs, hs)
    L = t.num_layers
    for s, h, lh in zip(seqs, out["hidden"], out["last_hidden"]):
        ref = capture_hidden_states(t.model, torch.tensor([s]), hs + [L])
        assert h.shape == (len(s), 3 * 64) and lh.shape == (len(s), 64)
        torch.testing.assert_close(h, torch.cat(list(ref.states[:3, 0]), dim=-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lh, ref.states[3, 0], atol=1e-5, rtol=1e-5)
    bf = capture_batch(t, seqs, hs, dtype=torch.bfloat16)
    assert bf["hidden"][0].dtype == torch.bfloat16
    torch.testing.assert_close(bf["hidden"][1], out["hidden"][1].to(torch.bfloat16))


# ---- end to end -----------------------------------------------------------------------------------

def test_datagen_manifest_and_conversations(dumps, tiny_llama_target, tiny_target):
    cfg, res = dumps["float32"]
    t = tiny_llama_target
    assert res.complete and res.prompts == len(PROMPTS) and res.skipped == 1
    assert res.samples == res.conversations == len(PROMPTS) - 1 and res.shards >= 3
    assert res.generate.samples == res.samples and res.generate.tokens > 0 and res.capture.tokens == res.tokens
    m = read_json(Path(cfg.out) / MANIFEST)
    assert m["format"] == "specwire-dump" and m["format_version"] == 1 and m["complete"] is True
    assert m["dtype"] == "float32" and m["max_length"] == MAX_LENGTH and m["target"] == str(tiny_target("llama"))
    w = Wiring.from_dict(m["wiring"])
    assert w.hs_ids == (2, 4, 5) and w.target == t.spec and w.draft_vocab_size is None
    assert w.tokenizer_fingerprint and w.chat_template_hash
    assert m["counts"]["skipped_prompts"] == 1 and m["skipped_prompts"][0]["id"] == f"p{LONG_INDEX}"
    assert m["options"]["max_new_tokens"] == 12 and m["options"]["hs_ids"] == [2, 4, 5]
    convs = read_conversations(Path(cfg.out) / "conversations.jsonl")
    assert sorted(r["index"] for r in convs) == [i for i in range(len(PROMPTS)) if i != LONG_INDEX]
    for r in convs:
        prompt_ids = t.encode_chat(PROMPTS[r["index"]])
        n = len(prompt_ids)
        assert r["input_ids"][:n] == prompt_ids and r["loss_mask"] == [0] * n + [1] * (len(r["input_ids"]) - n)
        assert r["messages"][0] == {"role": "user", "content": PROMPTS[r["index"]]}
        assert r["messages"][-1]["role"] == "assistant"
        # the stored answer is the target's own greedy answer, token for token (left padding is harmless)
        ref = plain_generate(t, prompt_ids, max_new_tokens=12)
        assert r["input_ids"][n:] == ref.output_ids and r["finish"] == ref.stop_reason


def test_padded_batching_gives_the_same_conversations(dumps, tiny_llama_target, prompt_file, tmp_path):
    """--batching padded (HF generate) and the default continuous batching: the same fp32 greedy answers."""
    cfg, _ = dumps["float32"]
    padded = make_config(tmp_path / "padded", prompt_file, cfg.target, batching="padded", batch_size=2)
    run_datagen(padded, target=tiny_llama_target)

    def records(out):
        return sorted(read_conversations(Path(out) / "conversations.jsonl"), key=lambda r: r["index"])

    a, b = records(cfg.out), records(padded.out)
    assert [(r["index"], torch.as_tensor(r["input_ids"]).tolist(), r["finish"]) for r in a] == \
        [(r["index"], torch.as_tensor(r["input_ids"]).tolist(), r["finish"]) for r in b]
    assert read_json(Path(padded.out) / MANIFEST)["options"]["batching"] == "padded"
    with pytest.raises(SpecwireError, match="datagen batching: 'static', expected continuous or padded"):
        make_config(tmp_path / "x", prompt_file, cfg.target, batching="static")


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_shards_hold_the_targets_own_states_and_logits(dumps, tiny_llama_target, dt):
    """Speculators-style check: lm_head(final_norm(last_hidden)) == the target's own next-token logits."""
    cfg, res = dumps[dt]
    t = tiny_llama_target
    reader = open_dump(cfg.out, expect=Wiring((2, 4, 5), target=t.spec))
    assert reader.dtype == getattr(torch, dt) and len(reader) == res.samples and reader.num_tokens == res.tokens
    convs = {r["index"]: r for r in reader.conversations()}
    agree = total = 0
    for s in reader:
        ids = s["input_ids"]
        assert ids.tolist() == convs[s["index"]]["input_ids"] and s["loss_mask"].tolist() == convs[s["index"]]["loss_mask"]
        with torch.no_grad():
            ref = capture_hidden_states(t.model, ids[None], [2, 4, 5], with_logits=True)
            dumped_logits = t.parts.lm_head(t.parts.final_norm(s["last_hidden"].float()))
        ref_hidden, ref_logits = ref.fused()[0], ref.logits[0]
        if dt == "float32":
            torch.testing.assert_close(s["hidden"], ref_hidden, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(dumped_logits, ref_logits, atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(s["hidden"], ref_hidden.to(torch.bfloat16), atol=2e-2, rtol=2e-2)
            err = (dumped_logits - ref_logits).abs().max() / ref_logits.abs().max()
            assert err < 2e-2, f"bf16 logits off by {err:.3%} of their range"
        # greedy answers: at each position before an assistant token, the target's argmax is that token
        pos = s["loss_mask"][1:].bool()
        agree += int((dumped_logits[:-1].argmax(-1)[pos] == ids[1:][pos]).sum())
        total += int(pos.sum())
    assert total > 0
    assert agree == total if dt == "float32" else agree >= 0.95 * total


def test_vocab_counts_and_split(dumps):
    cfg, res = dumps["float32"]
    reader = open_dump(cfg.out)
    counts = reader.vocab_counts()
    assert counts.dtype == torch.int64 and counts.shape == (260,) and int(counts.sum()) == res.loss_tokens
    manual = torch.zeros(260, dtype=torch.int64)
    for s in reader:
        manual += torch.bincount(s["input_ids"][s["loss_mask"].bool()], minlength=260)
    assert torch.equal(counts, manual)
    train, val = reader.split("train"), reader.split("val")
    assert val.indices == [i for i in reader.sample_indices() if i % VAL_EVERY == 0] == [0]
    assert sorted(train.indices + val.indices) == sorted(reader.sample_indices()) and len(train) == res.samples - 1
    assert [s["index"] for s in val] == [0] and all(not is_validation(s["index"]) for s in train)
    with pytest.raises(SpecwireError, match="unknown split"):
        reader.split("test")


def test_rerun_is_a_no_op_and_other_settings_are_refused(dumps, tiny_llama_target, tmp_path):
    cfg, res = dumps["float32"]
    out = tmp_path / "copy"
    shutil.copytree(cfg.out, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = run_datagen(make_config(out, cfg.prompts, cfg.target, dtype_dump="float32"), target=tiny_llama_target)
    assert again.generate.samples == 0 and again.capture.samples == 0 and again.samples == res.samples
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(WiringMismatch, match=r"hidden-state ids: expected hs \[1, 3, 5\].*found hs \[2, 4, 5\]"):
        run_datagen(make_config(out, cfg.prompts, cfg.target, dtype_dump="float32", hs_ids=(1, 3, 5)), target=tiny_llama_target)
    with pytest.raises(SpecwireError, match=r"max_new_tokens: dump has 12, this run has 20"):
        run_datagen(make_config(out, cfg.prompts, cfg.target, dtype_dump="float32", max_new_tokens=20), target=tiny_llama_target)
    with pytest.raises(SpecwireError, match=r"dtype_dump: dump has 'float32', this run has 'bfloat16'"):
        run_datagen(make_config(out, cfg.prompts, cfg.target), target=tiny_llama_target)


def test_bad_hs_ids_and_non_dump_folder_refused(tiny_llama_target, tiny_target, prompt_file, tmp_path):
    with pytest.raises(SpecwireError, match="has 2 ids"):
        run_datagen(make_config(tmp_path / "a", prompt_file, tiny_target("llama"), hs_ids=(1, 2)), target=tiny_llama_target)
    with pytest.raises(SpecwireError, match="out of range"):
        run_datagen(make_config(tmp_path / "b", prompt_file, tiny_target("llama"), hs_ids=(1, 2, 9)), target=tiny_llama_target)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(SpecwireError, match="non-empty folder without a dump manifest"):
        run_datagen(make_config(tmp_path / "c", prompt_file, tiny_target("llama")), target=tiny_llama_target)


def test_empty_prompt_file_is_a_clear_cli_error(tmp_path, tiny_target, capsys):
    from specwire.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    rc = main(["datagen", "--target", str(tiny_target("llama")), "--prompts", str(empty), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "empty.jsonl" in err and "at least one prompt" in err and "Traceback" not in err
    with pytest.raises(SpecwireError, match="no prompts"):
        run_datagen(make_config(tmp_path / "o2", empty, tiny_target("llama")), prompts=[])


def test_over_long_prompts_are_skipped_with_a_warning(tiny_llama_target, tiny_target, tmp_path, caplog):
    f = write_prompts(tmp_path / "p.jsonl", ["short one", "y" * 300])
    with caplog.at_level(logging.WARNING, logger="specwire"):
        res = run_datagen(make_config(tmp_path / "o", f, tiny_target("llama"), max_new_tokens=4), target=tiny_llama_target)
    assert "skipping prompt 'p1' (index 1)" in caplog.text and "--max-length 160" in caplog.text
    assert res.skipped == 1 and res.samples == 1
    assert read_json(tmp_path / "o" / MANIFEST)["counts"]["skipped_prompts"] == 1
    f2 = write_prompts(tmp_path / "q.jsonl", ["z" * 300])
    with pytest.raises(SpecwireError, match="every one of the 1 prompts is longer than --max-length"):
        run_datagen(make_config(tmp_path / "o3", f2, tiny_target("llama")), target=tiny_llama_target)


# ---- reading: refusals ------------------------------------------------------------------------------

def test_dump_of_another_target_is_refused(dumps, tiny_target):
    cfg, _ = dumps["float32"]
    other = load_target(tiny_target("llama", seed=1), device="cpu")
    with pytest.raises(WiringMismatch, match="target fingerprint: expected .* found .*weights of another model"):
        open_dump(cfg.out, expect=Wiring((2, 4, 5), target=other.spec))
    with pytest.raises(WiringMismatch, match=r"hidden-state ids: expected hs \[2, 3, 5\]"):
        open_dump(cfg.out, expect=open_dump(cfg.out).wiring.replace(hs_ids=(2, 3, 5)))


def test_mixed_wiring_and_corrupt_dumps_are_refused(dumps, tmp_path):
    cfg, _ = dumps["float32"]
    out = tmp_path / "d"
    shutil.copytree(cfg.out, out)
    shard = out / "shard-00001.safetensors"
    t = load_tensors(shard)
    # a shard captured at other ids, same width
    save_tensors(shard, t, metadata={"hs_ids": "1,4,5"})
    with pytest.raises(SpecwireError, match=r"shard-00001.safetensors: the shard was captured at hs ids \[1,4,5\].*mixes wirings"):
        open_dump(out)
    # a shard of another width (two fused states)
    save_tensors(shard, {**t, "hidden": t["hidden"][:, :128].contiguous()}, metadata={"hs_ids": "2,4"})
    with pytest.raises(SpecwireError, match="mixes wirings"):
        open_dump(out)
    save_tensors(shard, {**t, "hidden": t["hidden"][:, :128].contiguous()})
    with pytest.raises(SpecwireError, match=r"tensor 'hidden' is 128 wide.*fuses 3 states.*mixes wirings"):
        open_dump(out)
    # a truncated shard
    save_tensors(shard, t)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(SpecwireError, match="shard-00001.safetensors.*truncated"):
        open_dump(out)
    # wrong dtype
    save_tensors(shard, {**t, "loss_mask": t["loss_mask"].long()})
    with pytest.raises(SpecwireError, match=r"tensor 'loss_mask' is I64 .*expected U8"):
        open_dump(out)
    save_tensors(shard, t)
    open_dump(out)
    # bad offsets only show when the shard is read
    save_tensors(shard, {**t, "offsets": t["offsets"].flip(0).contiguous()})
    with pytest.raises(SpecwireError, match="'offsets' must rise"):
        list(open_dump(out))
    save_tensors(shard, t)
    m = read_json(out / MANIFEST)
    write_json(out / MANIFEST, {**m, "format_version": 7})
    with pytest.raises(SpecwireError, match="format_version 7"):
        open_dump(out)
    write_json(out / MANIFEST, {**m, "complete": False})
    with pytest.raises(SpecwireError, match="incomplete.*rerun the same `specwire datagen`"):
        open_dump(out)
    assert len(open_dump(out, allow_incomplete=True)) == len(open_dump(cfg.out))


# ---- kill -9 and resume -----------------------------------------------------------------------------

# The child is the real `specwire datagen`, on a slow disk: every fsync and every atomic rename returns
# only after SLOW_DISK_S seconds, so that a poller watching the output files sees each stage and can send
# SIGKILL inside it. Nothing in the library knows it is being tested.
_CHILD = """
import os, sys, time
delay = float(os.environ["SLOW_DISK_S"])
_fsync, _replace = os.fsync, os.replace
def fsync(fd):
    _fsync(fd)
    time.sleep(delay)
def replace(src, dst, **kw):
    _replace(src, dst, **kw)
    time.sleep(delay)
os.fsync, os.replace = fsync, replace
from specwire.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _manifest_or_none(out: Path) -> dict | None:
    try:
        return json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _stray_shard(out: Path) -> bool:
    """A shard file is on disk that the manifest does not list (written, not yet recorded)."""
    m = _manifest_or_none(out)
    files = {p.name for p in out.glob("shard-*.safetensors")} if out.exists() else set()
    return m is not None and bool(files - {s["file"] for s in m["shards"]})


def _records(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _two_shards_listed(out: Path) -> bool:
    m = _manifest_or_none(out)
    return m is not None and len(m["shards"]) >= 2 and not m["complete"]


def _kill_when(args, condition, *, delay: float, timeout: float = 300) -> bool:
    """Run datagen in a child; SIGKILL it as soon as `condition()` holds. False if it finished first."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SLOW_DISK_S": str(delay)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, "datagen", *args, "--no-progress"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if condition():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.01)
        assert proc.poll() == 0, proc.communicate()[1][-2000:].decode(errors="replace")
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_target, tiny_llama_target, prompt_file):
    target_dir = tiny_target("llama")
    ref = make_config(tmp_path / "ref", prompt_file, target_dir, device="cpu", dtype="float32")
    run_datagen(ref, target=tiny_llama_target)
    refdir = Path(ref.out)
    for attempt, delay in enumerate((0.3, 1.0, 2.0)):  # a loaded machine may need a slower disk to be caught
        out = tmp_path / f"crashed{attempt}"
        convs = out / "conversations.jsonl"
        args = ["--target", str(target_dir), "--prompts", str(prompt_file), "--out", str(out), "--device", "cpu",
                "--max-new-tokens", "12", "--max-length", str(MAX_LENGTH), "--batch-size", "3", "--shard-tokens", "100",
                "--dtype", "float32"]
        # 1. killed while appending conversations; then a torn last line, as a kill inside write() leaves
        if not _kill_when(args, lambda: _lines(convs) >= 2, delay=delay):
            continue
        n = _lines(convs)
        assert 2 <= n < len(PROMPTS) - 1 and not read_json(out / MANIFEST)["complete"]
        with open(convs, "ab") as f:
            f.write(b'{"index": 99, "id": "p99", "sou')
        # 2. killed after a shard file is written but before the manifest lists it
        if not _kill_when(args, lambda: _stray_shard(out), delay=delay):
            continue
        assert _stray_shard(out)
        # 3. killed after two shards and their manifest
        if not _kill_when(args, lambda: _two_shards_listed(out), delay=delay):
            continue
        assert _two_shards_listed(out)
        break
    else:
        pytest.fail("the child finished before every kill point could be reached, even on the slowest disk")
    r = subprocess.run([sys.executable, "-m", "specwire", "datagen", *args, "--no-progress"],
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in refdir.iterdir())
    # the same records; continuous batching appends them in finishing order, which resuming changes
    assert sorted(_records(convs)) == sorted(_records(refdir / "conversations.jsonl"))
    m, mref = read_json(out / MANIFEST), read_json(refdir / MANIFEST)
    assert m == mref
    for p in refdir.glob("*.safetensors"):
        a, b = load_tensors(out / p.name), load_tensors(p)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), p.name


# ---- the built-in target ----------------------------------------------------------------------------

@pytest.mark.slow
def test_builtin_target_dump_reproduces_its_logits(tmp_path):
    t = load_target("smollm2-135m", device="cpu")
    f = write_prompts(tmp_path / "p.jsonl", ["What is the capital of France?", "Write a haiku about autumn."])
    cfg = DatagenConfig(out=str(tmp_path / "d"), prompts=str(f), max_new_tokens=16, batch_size=2, progress=False)
    res = run_datagen(cfg, target=t)
    assert res.samples == 2 and res.hs_ids == [2, 15, 27]
    reader = open_dump(cfg.out, expect=Wiring((2, 15, 27), target=t.spec))
    agree = total = 0
    for s in reader:
        with torch.no_grad():
            ref = capture_hidden_states(t.model, s["input_ids"][None], [2, 15, 27], with_logits=True)
            logits = t.parts.lm_head(t.parts.final_norm(s["last_hidden"].float()))
        err = (logits - ref.logits[0]).abs().max() / ref.logits[0].abs().max()
        assert err < 3e-2
        pos = s["loss_mask"][1:].bool()
        agree += int((logits[:-1].argmax(-1)[pos] == s["input_ids"][1:][pos]).sum())
        total += int(pos.sum())
    assert agree >= 0.9 * total


# ---- answers from an OpenAI-compatible server ------------------------------------------------------------

@pytest.fixture
def served_tiny_target(tiny_llama_target):
    """`specwire serve`'s app over the tiny target (plain greedy decoding) on a loopback port: its base URL."""
    import socket
    import threading

    uvicorn = pytest.importorskip("uvicorn")
    from specwire.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(tiny_llama_target, None, model_name="tiny"), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


def test_generator_answers_come_from_an_openai_compatible_server(served_tiny_target, tiny_llama_target, tiny_target,
                                                                 prompt_file, tmp_path):
    t = tiny_llama_target
    cfg = make_config(tmp_path / "g", prompt_file, tiny_target("llama"), generator=served_tiny_target)
    res = run_datagen(cfg, target=t)
    assert res.complete and res.samples == len(PROMPTS) - 1 and res.skipped == 1
    m = read_json(tmp_path / "g" / MANIFEST)
    assert m["generator"]["url"] == served_tiny_target and m["generator"]["model"] == "tiny"  # from /v1/models
    assert "re-tokenized" in m["generator"]["token_ids"] and m["options"]["generator"] == served_tiny_target
    convs = read_conversations(tmp_path / "g" / "conversations.jsonl")
    for r in convs:
        prompt_ids = t.encode_chat(PROMPTS[r["index"]])
        n = len(prompt_ids)
        ref = plain_generate(t, prompt_ids, max_new_tokens=12)
        served = t.tokenizer.decode(ref.output_ids, skip_special_tokens=True)  # the server's greedy answer
        # re-tokenized after the prompt (byte soup can take more tokens than it was sampled in: capped at 12)
        expected = t.tokenizer(served, add_special_tokens=False)["input_ids"] + ([t.eos_token_ids[0]] if ref.stop_reason == "eos" else [])
        assert r["input_ids"][:n] == prompt_ids and r["input_ids"][n:] == expected[:12]
        assert r["messages"][-1]["content"] == t.tokenizer.decode(expected[:12], skip_special_tokens=True)
        assert r["loss_mask"] == [0] * n + [1] * (len(r["input_ids"]) - n)
    reader = open_dump(cfg.out)
    by_index = {r["index"]: r for r in convs}
    assert all(s["input_ids"].tolist() == by_index[s["index"]]["input_ids"] for s in reader)  # captured as usual
    with pytest.raises(SpecwireError, match=r"generator: dump has .*this run does not set it"):
        run_datagen(make_config(tmp_path / "g", prompt_file, tiny_target("llama")), target=t)


def test_server_answer_ids_end_with_the_templates_end_of_turn(tiny_llama_target):
    from specwire.data.generator import ServerAnswer, answer_ids, base_url

    t = tiny_llama_target
    messages = [{"role": "user", "content": "hi"}]
    prompt = t.encode_chat(messages)
    text_ids = t.tokenizer("Hello there!", add_special_tokens=False)["input_ids"]
    # "stop": the ids the chat template gives the answer, up to and including its end-of-turn token
    assert answer_ids(t, messages, prompt, ServerAnswer("Hello there!", "stop")) == [*text_ids, t.eos_token_ids[0]]
    assert answer_ids(t, messages, prompt, ServerAnswer("Hello there!", "length")) == text_ids
    # a prompt the template does not reproduce: the text's own ids and the first EOS id
    assert answer_ids(t, messages, [*prompt, 7], ServerAnswer("Hello there!", "stop")) == [*text_ids, t.eos_token_ids[0]]
    assert base_url("http://h:1") == base_url("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(SpecwireError, match="expected an http"):
        base_url("h:1")

"""Online vs offline: the engine's live acceptance per draft position against `specwire eval`.

A wiring slip in what the engine feeds the draft (states of the wrong positions or layers, wrong
draft positions) keeps the output lossless and only lowers acceptance, so it is tested here by
measurement. Setup (module fixture, all real code paths): a tiny 8-layer Llama target with large
random weights (initializer_range 0.25, as in test_doctor), 24 JSONL prompts, `run_datagen` (greedy,
40 new tokens, float32 dump), `train` (K = 4 TTT steps, 400 steps at lr 1e-2: the draft memorises its
data, fine, this tests consistency, not generalisation), `evaluate(split="all")` -> a_k, and the chain
engine, greedy, on the same prompts with the same max_new_tokens.

What is compared, precisely. The engine regenerates every dumped answer token for token (asserted),
so every accepted draft token is the dump's token, and in a round at position b the draft's step-k
input (its own step k-1 hidden state and token x_{b+1+k}) is exactly TTT's teacher-forced input at
t = b, step k. Live draft position k at round b is therefore accepted iff the offline step-k
prediction at t = b is right: hits[b, k] (table computed below, tied to `evaluate` by its mean).
  1. Exact: replaying the engine's chain rounds over the dumped answer with the offline hit table
     gives the live `accept_counts` / `reach_counts` (measured: identical counts; tolerance 0.02 per
     rate for numerical near-ties between the batched dump capture and the incremental engine).
  2. Against `specwire eval`'s a_k = mean of hits[t, k] over all answer positions t. Live position k
     averages hits[b, k] only over round starts b where steps 0..k-1 were right. The two coincide when
     hits are independent across steps and round starts are a representative sample of positions.
     Neither holds exactly: (i) consecutive steps are right together on easy stretches, so for k >= 1
     the matching offline number is the conditional accuracy c_k = P(hits[t, k] | hits[t, <k])
     (measured c_k ~ a_k + 0.04); (ii) a round starts right after a rejection (or a full chain), and
     rejections cluster, so live position 0 runs below a_0 (measured 0.61 vs 0.71 here; the replay of
     (1) reproduces it exactly, so it is selection, not wiring). Bounds: |live_0 - a_0| <= 0.15 and
     |live_k - c_k| <= max(0.05, 3 standard errors of live_k) (~0.12 at ~100 reached rounds).
  3. The test can fail: served with the hs ids permuted, the output stays lossless and live position
     0 falls to ~0.05 (bounded here by a_0 / 2).

The tree (EAGLE-2 dynamic, topk 4, 16 nodes, depth K). Along the dumped answer, a tree node on the true
path at depth j+1 is fed exactly TTT step j's teacher-forced input (its ancestors are the true tokens,
the tree mask shows it the real prefix and those ancestors, the position is b), so its children are
the draft's top-4 at step j, t = b. A round at b therefore accepts at most the leading run of
topk_hits[b, :] (true token among the offline top-4), and exactly that run unless the dynamic tree
pruned the true path (frontier: top-4 of 16 by cumulative log-probability; budget: 16 of 52).
  4. Every live tree round (recorded by wrapping the engine's greedy verification) accepts a prefix of
     the offline top-4 run at its b (tolerance: 2% of rounds, for numerical near-ties), and equals the
     run in most rounds (pruning; bound below, measured in the test's message on failure).
  5. Over the live round starts, live position 0 equals the offline top-4 rate (the root's 4 children
     always survive pruning; tolerance 0.02), deeper positions never exceed the offline rate (pruning
     only removes), and position 0 is at least the chain's.
  6. The test can fail: served with the hs ids permuted, tree position 0 collapses as the chain's does.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate

from helpers import make_tiny_target_dir

K = 4  # TTT steps = chain depth
# the engine's default tree shape at depth K; no copied tokens: these tests follow the draft's own acceptance round by
# round, which copied tokens would move (the rounds' starts, not the draft's rates)
TREE = SpecConfig(budget="fixed", num_steps=K, topk=4, num_draft_tokens=16, lookup=0)
NEW_TOKENS = 40
WORDS = ["apple", "river", "stone", "cloud", "seven", "green", "quiet", "north"]


def write_prompts(path, n: int, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = [WORDS[j] for j in torch.randint(0, len(WORDS), (3,), generator=g).tolist()]
            f.write(json.dumps({"prompt": " ".join(words), "id": f"p{i}"}) + "\n")
    return path


@torch.no_grad()
def offline_hits(draft, target, sample, steps: int, topk: int = 1) -> torch.Tensor:
    """hits[t, j]: TTT step j at position t (teacher forced, constant positions, as `ttt.ttt_unroll`)
    predicts the target's argmax at t+1+j (with topk > 1: the argmax is among the step's `topk` most
    likely draft tokens). False where t+1+j is past the sample. shape: [T, steps] bool"""
    from specwire.training.ttt import TTTAttend

    ids = sample["input_ids"][None]  # shape: [1, T]
    T = ids.shape[1]
    target_next = target.parts.lm_head(target.parts.final_norm(sample["last_hidden"].float())).argmax(-1)  # shape: [T]
    h = draft.fuse(sample["hidden"][None].float())  # shape: [1, T, H]
    cos, sin = draft.rope(torch.arange(T)[None], h)
    emb = draft.embed(ids)  # shape: [1, T, H]
    attend = TTTAttend()
    hits = torch.zeros(T, steps, dtype=torch.bool)
    for j in range(steps):
        e = F.pad(emb[:, 1 + j:], (0, 0, 0, 1 + j))[:, :T]  # token x_{t+1+j}
        h = draft.step(h, attend, embeds=e, rope=(cos, sin))
        pred = draft.to_target_ids(draft.logits(h)[0].topk(topk, dim=-1).indices)  # shape: [T, topk]
        hits[:T - 1 - j, j] = (pred[:T - 1 - j] == target_next[1 + j:, None]).any(-1)
    return hits


def replay_chain(hits: torch.Tensor, *, prompt_len: int, max_new_tokens: int, steps: int) -> tuple[list[int], list[int]]:
    """The engine's greedy chain rounds over a dumped answer, decided by the offline hit table.

    The first round starts at the last prompt position; a round accepts the leading hits of its row
    and moves past the bonus token; its depth is capped as the engine caps it (one token is left for
    the bonus). Returns (accept_counts, reach_counts) as `speculative_generate` counts them."""
    accept, reach = [0] * steps, [0] * steps
    answer_len = hits.shape[0] - prompt_len
    b, produced = prompt_len - 1, 1  # the prefill produced the root x_{b+1}
    while produced < answer_len:
        depth = min(steps, max_new_tokens - produced - 1)
        n = 0
        while n < depth and bool(hits[b, n]):
            n += 1
        for k in range(depth):
            if n >= k:
                reach[k] += 1
                accept[k] += n > k
        b += n + 1
        produced += n + 1
    return accept, reach


def rates(accept, reach) -> list[float]:
    return [a / r if r else 0.0 for a, r in zip(accept, reach)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from specwire.data.datagen import DatagenConfig, run_datagen
    from specwire.data.dump import open_dump
    from specwire.training.evaluate import evaluate
    from specwire.target.load import load_target
    from specwire.training.config import TrainConfig
    from specwire.training.trainer import train

    root = tmp_path_factory.mktemp("online-offline")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread avoids OpenMP spin-waiting on a shared CPU
    try:
        torch.manual_seed(0)
        tdir = make_tiny_target_dir(root, "llama", seed=0, initializer_range=0.25)
        target = load_target(tdir, device="cpu", dtype="float32")
        dump = root / "dump"
        run_datagen(DatagenConfig(out=str(dump), prompts=str(write_prompts(root / "prompts.jsonl", 24)), target=str(tdir),
                                  max_new_tokens=NEW_TOKENS, max_length=128, batch_size=8, dtype_dump="float32",
                                  progress=False), target=target)
        run = train(TrainConfig(data=str(dump), out=str(root / "run"), ttt_steps=K, lr=1e-2, max_steps=400, epochs=1000.0,
                                batch_size=8, warmup_ratio=0.05, save_every=10**6, log_every=100, device="cpu",
                                progress=False))
        offline = evaluate(str(run.draft_dir), dump, target=target, ttt_steps=K, split="all", device="cpu")
        samples = list(open_dump(dump).iter_samples(None))
        draft = load_engine_draft(run.draft_dir, target)
        hits = [offline_hits(draft, target, s, K) for s in samples]
        topk_hits = [offline_hits(draft, target, s, K, topk=TREE.topk) for s in samples]
        yield dict(target=target, draft_dir=run.draft_dir, draft=draft, offline=offline, samples=samples, hits=hits,
                   topk_hits=topk_hits)
    finally:
        torch.set_num_threads(threads)


def run_live(target, draft, samples):
    """Greedy chain decoding of every dumped prompt; pooled raw counts, and whether each answer was reproduced."""
    accept, reach, same, passes, produced = [0] * K, [0] * K, [], 0, 0
    for s in samples:
        ids = s["input_ids"].tolist()
        P = int((s["loss_mask"] == 0).sum())
        r = speculative_generate(target, draft, ids[:P], max_new_tokens=NEW_TOKENS, tree=False,
                                 spec=SpecConfig(budget="fixed", num_steps=K, tree=False, lookup=0))
        same.append(r.output_ids == ids[P:])
        accept = [a + b for a, b in zip(accept, r.extra["accept_counts"])]
        reach = [a + b for a, b in zip(reach, r.extra["reach_counts"])]
    return accept, reach, same


def test_offline_hit_table_is_what_eval_measures(setup):
    """The per-position table behind the comparisons averages to `evaluate`'s a_k (at most one token off)."""
    offline = setup["offline"]
    correct, count = [0] * K, [0] * K
    for s, hits in zip(setup["samples"], setup["hits"]):
        T = hits.shape[0]
        for j in range(K):
            scored = s["loss_mask"].bool()[1 + j:]  # target position p = t+1+j carries the loss mask
            correct[j] += int(hits[:T - 1 - j, j][scored].sum())
            count[j] += int(scored.sum())
    assert count == offline.step_tokens
    for j in range(K):
        assert abs(correct[j] / count[j] - offline.step_accuracy[j]) <= 1.0 / count[j]
    assert min(offline.step_accuracy) > 0.5  # the draft learned its data: the comparison is not between zeros


def test_live_acceptance_matches_offline(setup):
    target, draft, samples, offline = setup["target"], setup["draft"], setup["samples"], setup["offline"]
    accept, reach, same = run_live(target, draft, samples)
    assert all(same), "greedy speculative decoding must regenerate the self-distilled answers"
    live = rates(accept, reach)

    # 1. exact: the replay of the offline hit table predicts the engine's counts
    r_accept, r_reach = [0] * K, [0] * K
    for s, hits in zip(samples, setup["hits"]):
        a, r = replay_chain(hits, prompt_len=int((s["loss_mask"] == 0).sum()), max_new_tokens=NEW_TOKENS, steps=K)
        r_accept = [x + y for x, y in zip(r_accept, a)]
        r_reach = [x + y for x, y in zip(r_reach, r)]
    replay = rates(r_accept, r_reach)
    for k in range(K):
        assert abs(live[k] - replay[k]) <= 0.02, (k, live, replay, accept, reach, r_accept, r_reach)
    assert min(reach) >= 50  # enough reached rounds at every position for the bounds below

    # 2. against `specwire eval`: a_0 at position 0, conditional offline accuracy c_k at k >= 1
    a = offline.step_accuracy
    assert abs(live[0] - a[0]) <= 0.15, (live, a)
    cond_hit, cond_n = [0] * K, [0] * K
    for s, hits in zip(samples, setup["hits"]):
        P = int((s["loss_mask"] == 0).sum())
        rows = hits[P - 1:hits.shape[0] - K]  # answer positions where every step is scored
        for k in range(K):
            given = rows[:, :k].all(-1)
            cond_hit[k] += int(rows[given, k].sum())
            cond_n[k] += int(given.sum())
    c = rates(cond_hit, cond_n)
    for k in range(1, K):
        tol = max(0.05, 3 * math.sqrt(c[k] * (1 - c[k]) / reach[k]))
        assert abs(live[k] - c[k]) <= tol, (k, live, c, reach)


def test_wrong_wiring_lowers_live_acceptance(setup):
    """hs ids permuted at serving time: still lossless, but the draft reads other states and acceptance collapses."""
    target, samples, offline = setup["target"], setup["samples"], setup["offline"]
    hs = list(setup["draft"].config.wiring.hs_ids)
    wrong = load_engine_draft(setup["draft_dir"], target, hs_ids_override=hs[::-1])
    accept, reach, same = run_live(target, wrong, samples)
    assert all(same)
    live = rates(accept, reach)
    assert live[0] <= offline.step_accuracy[0] / 2, (live, offline.step_accuracy)


def test_live_tree_acceptance_matches_offline_top_k(setup, monkeypatch):
    """Tree rounds, one by one, against the offline top-4 hit table (module docstring, points 4 and 5)."""
    from specwire.decode import engine

    target, draft, samples = setup["target"], setup["draft"], setup["samples"]
    rounds: list[tuple[int, int]] = []  # (accepted, tree depth) of each verification pass, in order
    verify = engine.verify_greedy

    def recording(tree, argmax):
        res = verify(tree, argmax)
        rounds.append((res.num_accepted, tree.max_depth))
        return res

    monkeypatch.setattr(engine, "verify_greedy", recording)
    violations = exact = total = 0
    live_acc, live_reach, off_acc = [0] * K, [0] * K, [0] * K
    for s, topk_hits in zip(samples, setup["topk_hits"]):
        ids = s["input_ids"].tolist()
        P = int((s["loss_mask"] == 0).sum())
        rounds.clear()
        r = speculative_generate(target, draft, ids[:P], max_new_tokens=NEW_TOKENS, tree=True, spec=TREE)
        assert r.output_ids == ids[P:], "greedy tree decoding must regenerate the self-distilled answers"
        assert r.extra["tree"] is True
        b = P - 1
        for n, depth in rounds:
            run = 0
            while run < depth and bool(topk_hits[b, run]):
                run += 1
            violations += n > run
            exact += n == run
            total += 1
            for k in range(depth):
                if n >= k:
                    live_reach[k] += 1
                    live_acc[k] += n > k
                    off_acc[k] += run > k  # the offline table's verdict at the same round start
            b += n + 1
        assert [a for a in live_acc] and r.extra["num_verify_passes"] == len(rounds)
    assert violations <= 0.02 * total, (violations, total)
    assert exact >= 0.8 * total, (exact, total)
    live, offline = rates(live_acc, live_reach), rates(off_acc, live_reach)
    # position 0: the root's top-4 children always survive pruning (a child never outscores its parent,
    # so the 4 depth-1 nodes are the first 4 of the 16 kept), so live equals the offline top-4 rate
    assert abs(live[0] - offline[0]) <= 0.02, (live, offline, live_reach)
    # deeper: the dynamic tree can only prune the true path away, never add to the offline verdict
    for k in range(1, K):
        assert live[k] <= offline[k] + 0.02, (k, live, offline, live_reach)
    assert min(live_reach[:-1]) >= 30 and live_reach[-1] >= 10, live_reach  # every position is exercised
    chain_accept, chain_reach, _ = run_live(target, draft, samples)
    assert live[0] >= rates(chain_accept, chain_reach)[0] - 0.02


def test_wrong_wiring_lowers_live_tree_acceptance(setup):
    """The tree's negative control: permuted hs ids at serving time, still lossless, acceptance collapses."""
    target, samples, offline = setup["target"], setup["samples"], setup["offline"]
    hs = list(setup["draft"].config.wiring.hs_ids)
    wrong = load_engine_draft(setup["draft_dir"], target, hs_ids_override=hs[::-1])
    accepted = rounds = 0
    for s in samples:
        ids = s["input_ids"].tolist()
        P = int((s["loss_mask"] == 0).sum())
        r = speculative_generate(target, wrong, ids[:P], max_new_tokens=NEW_TOKENS, tree=True, spec=TREE)
        assert r.output_ids == ids[P:]
        accepted += r.extra["accept_counts"][0]
        rounds += r.extra["reach_counts"][0]
    assert accepted / rounds <= offline.step_accuracy[0] / 2, (accepted, rounds, offline.step_accuracy)

"""Continuous batching (`specwire.data.continuous`): the same answers as unbatched greedy decoding.

On tiny models of every supported architecture in fp32: more requests than rows (finished rows are
refilled), prompts of mixed lengths with a long one admitted late (the buffer shifts right), a tiny
compaction margin (the buffer compacts every few steps), per-request limits, and an end-of-turn token
that ends some answers early. Each answer is compared token for token with HF `generate` on that
prompt alone. Also: sampling is reproducible per seed, windowed attention is refused, bad input is named.
"""

from __future__ import annotations

import pytest
import torch

import specwire.data.continuous as continuous
from helpers import ARCHS, prompt_of
from specwire.data.continuous import Request, generate_continuous, supports_continuous
from specwire.data.datagen import generate_batch
from specwire.decode.sampling import SamplingParams
from specwire.errors import SpecwireError
from specwire.target.load import load_target

LENGTHS = (5, 9, 3, 14, 7, 40, 6, 11)  # the 40-token prompt arrives after shorter ones hold the rows
LIMITS = (12, 7, 12, 3, 12, 9, 12, 1)


def unbatched(target, requests):
    return [generate_batch(target, [list(r.prompt_ids)], max_new_tokens=r.limit, max_length=4096)[0] for r in requests]


@pytest.mark.parametrize("arch", ARCHS)
def test_answers_equal_unbatched_greedy_decoding(tiny_target, arch, monkeypatch):
    target = load_target(tiny_target(arch), device="cpu", dtype="float32")
    requests = [Request(tuple(prompt_of(n, seed=i)), lim) for i, (n, lim) in enumerate(zip(LENGTHS, LIMITS))]
    first = unbatched(target, requests[:1])[0][0]
    target.model.generation_config.eos_token_id = [first[2]]  # an end-of-turn token that some answers reach
    want = unbatched(target, requests)
    assert any(f == "eos" for _, f in want) and any(f == "length" for _, f in want)
    monkeypatch.setattr(continuous, "COMPACT_MARGIN", 2)  # compaction every couple of steps
    for slots in (1, 3, 8, 32):
        done = []
        got = generate_continuous(target, requests, slots=slots, on_done=lambda i, ids, f: done.append(i))
        assert got == want, f"{arch}, {slots} rows"
        assert sorted(done) == list(range(len(requests)))


def test_limits_and_end_of_turn(tiny_llama_target):
    target = tiny_llama_target
    reqs = [Request(tuple(prompt_of(6, seed=s)), lim) for s, lim in ((0, 1), (1, 5), (2, 16))]
    for (ids, finish), r in zip(generate_continuous(target, reqs, slots=2), reqs):
        eos = [k for k, t in enumerate(ids) if t in target.eos_token_ids]
        assert len(ids) <= r.limit
        assert (finish == "eos") == bool(eos) and (not eos or eos == [len(ids) - 1])
        assert finish == "eos" or len(ids) == r.limit


def test_sampling_is_reproducible_per_seed(tiny_llama_target):
    reqs = [Request(tuple(prompt_of(8, seed=0)), 16)] * 6
    params = SamplingParams(temperature=1.0)
    a = generate_continuous(tiny_llama_target, reqs, slots=4, params=params, seed=3)
    b = generate_continuous(tiny_llama_target, reqs, slots=4, params=params, seed=3)
    c = generate_continuous(tiny_llama_target, reqs, slots=4, params=params, seed=4)
    assert a == b and a != c
    assert len({tuple(ids) for ids, _ in a}) > 1  # the rows draw different tokens from one prompt


def test_a_sliding_window_shorter_than_the_sequences_is_refused(tiny_target):
    target = load_target(tiny_target("mistral", sliding_window=8), device="cpu", dtype="float32")
    assert supports_continuous(target, 8) is None
    assert "sliding attention window (8 tokens)" in supports_continuous(target, 20)
    with pytest.raises(SpecwireError, match="--batching padded"):
        generate_continuous(target, [Request(tuple(prompt_of(10)), 10)], slots=2)


def test_bad_input_is_named(tiny_llama_target):
    with pytest.raises(SpecwireError, match="slots must be a positive integer, found 0"):
        generate_continuous(tiny_llama_target, [Request((1, 2), 3)], slots=0)
    with pytest.raises(SpecwireError, match="request 1 needs a non-empty prompt"):
        generate_continuous(tiny_llama_target, [Request((1, 2), 3), Request((), 3)], slots=2)
    assert generate_continuous(tiny_llama_target, [], slots=2) == []


def test_bf16_keys_are_stored_wide_and_rows_attention_matches_sdpa():
    """The one-token rows kernel equals sdpa (fp32 maths) on masked, strided, grouped-query inputs."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specwire.target.attention import rows_attention

    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D = 5, 6, 2, 19, 8
    q = torch.randn(B, H, 1, D, generator=g)
    kbuf, vbuf = torch.randn(B, Hkv, T + 7, D, generator=g), torch.randn(B, Hkv, T + 7, D, generator=g)
    k, v = kbuf[:, :, :T], vbuf[:, :, :T]  # strided views, as the slot cache returns them
    mask = torch.arange(T)[None] >= torch.tensor([0, 3, 7, 18, 1])[:, None]
    mask = mask.view(B, 1, 1, T)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = H // Hkv, False, False
    want, _ = sdpa_attention_forward(module, q, k, v, mask)
    got, _ = rows_attention(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_prefill_groups_cover_every_prompt_within_the_padding_cap(monkeypatch):
    from specwire.data.continuous import _prefill_groups

    monkeypatch.setattr(continuous, "PREFILL_TOKENS", 100)
    lengths = {0: 30, 1: 10, 2: 60, 3: 20, 4: 150, 5: 25}
    groups = _prefill_groups(list(lengths), lengths)
    assert sorted(i for g in groups for i in g) == list(lengths)
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 100
    assert groups[0] == [1, 3, 5]  # shortest first: 3 x 25 <= 100, a fourth (30) would make 120

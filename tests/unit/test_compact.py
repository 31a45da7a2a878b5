"""Exact compact weights (`target.compact`) and the rowdot kernel reading them.

A weight dequantized from a GGUF file (q4_1 or q8_0, as llama.cpp quantizes and gguf-py dequantizes) packs
into its form, whose `.float()` is bitwise the weight; bf16 numbers pack as bf16; any other weight packs into
nothing. The kernel over a packed weight gives bitwise the float32 kernel's rows, for every row count, with and
without bias, on 1 and 2 threads; the one lossy packer (`nearest_q8_0`, a served draft's) stays within half a
step of each weight; a GGUF-like tiny target reads its codes under `--linear rowdot`, keeps its
passes bitwise single steps, and decodes speculatively token for token as it decodes plainly (the engine's
side of that is in test_fastlinear); and (slow) the built-in target, converted from a Q4_1 file, packs whole.
"""

from __future__ import annotations

import pytest
import torch

from helpers import gguf_dequantized, make_gguf_like_target_dir, prompt_of
from specwire.decode.invariance import pass_invariance
from specwire.target.compact import FORMS, _pack4, _unpack4, nearest_q8_0, pack
from specwire.target.fastlinear import RowDotLinear, weight_bytes
from specwire.target.load import load_target
from specwire.target.rowdot import rowdot


def _weights(form: str, n: int = 67, k: int = 96, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    return w.bfloat16().float() if form == "bf16" else gguf_dequantized(w, form)


def test_four_bit_codes_round_trip_in_ggufs_layout():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = _pack4(q)
    assert packed.shape == (5, 32) and torch.equal(_unpack4(packed, 64), q)
    assert packed[0, 0] == q[0, 0] | (q[0, 16] << 4)  # byte i of a block: code i low, code i + 16 high


@pytest.mark.parametrize("form,bits", [("q4_1", 6), ("q8_0", 9), ("bf16", 16)])
def test_a_weight_packs_exactly_into_its_form(form, bits):
    w = _weights(form)
    c = pack(w)
    assert c is not None and c.form == form and c.shape == tuple(w.shape)
    assert torch.equal(c.float(), w)
    assert c.nbytes == w.numel() * bits // 8


def test_the_nearest_q8_0_codes_are_within_half_a_step_of_each_weight():
    """The one lossy packer (a served draft's): per block of 32 k, d = largest magnitude / 127, q = round(w / d). Each
    rebuilt weight is within d / 2 of the weight; each block's largest magnitude takes code 127 exactly; a block of
    zeros is zeros; a weight already on a q8_0 grid (a GGUF's) comes back bitwise; bf16 numbers are taken as is."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(9, 96, generator=g) * 0.05
    w[2, 32:64] = 0
    c = nearest_q8_0(w)
    assert c.form == "q8_0" and c.codes.dtype == torch.int8 and c.shape == (9, 96) and c.nbytes == 9 * 96 * 9 // 8
    err = (c.float() - w).view(9, 3, 32).abs()
    assert (err <= c.d[..., None] * (0.5 + 1e-6)).all()
    assert err.max() > 0  # lossy: random float32 weights are not on the grid
    q = c.codes.view(9, 3, 32).abs().amax(-1)
    assert c.d[2, 1] == 0 and (c.float()[2, 32:64] == 0).all()
    assert ((q == 127) | (c.d == 0)).all()
    on_grid = gguf_dequantized(w, "q8_0")
    assert torch.equal(nearest_q8_0(on_grid).float(), on_grid)
    assert torch.equal(nearest_q8_0(w.bfloat16()).codes, nearest_q8_0(w.bfloat16().float()).codes)


def test_the_nearest_q8_0_codes_refuse_what_they_cannot_hold():
    with pytest.raises(ValueError, match=r"K a multiple of 32, found shape \(4, 40\)"):
        nearest_q8_0(torch.randn(4, 40))
    nan = torch.randn(4, 32)
    nan[1, 3] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        nearest_q8_0(nan)


def test_a_weight_no_form_holds_packs_into_nothing():
    g = torch.Generator().manual_seed(1)
    assert pack(torch.randn(8, 64, generator=g)) is None  # float32 numbers with every mantissa bit in use
    w = _weights("q4_1")
    w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(1.0))  # one element off the grid: q4_1 cannot, bf16 cannot
    assert pack(w) is None
    assert pack(_weights("q4_1"), forms=("q8_0",)) is None  # only the forms asked for
    nan = _weights("bf16")
    nan[0, 0] = float("nan")
    assert pack(nan) is None
    odd = torch.randn(4, 7, generator=g).bfloat16().float()  # K % 32 != 0: only bf16 applies
    assert pack(odd).form == "bf16"
    assert pack(odd.double()) is None


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n,bias", [(67, True), (24, False), (5, True)])
def test_the_kernel_over_a_packed_weight_is_bitwise_the_float32_kernel(form, n, bias):
    w = _weights(form, n=n, seed=n)
    c = pack(w)
    g = torch.Generator().manual_seed(2)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(17, w.shape[1], generator=g)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            single = torch.cat([rowdot(x[i:i + 1], c, b) for i in range(17)])
            for m in range(1, 18):
                got = rowdot(x[:m], c, b)
                assert torch.equal(got, rowdot(x[:m], w, b)), f"{form}, M={m}, {threads} threads"
                assert torch.equal(got, single[:m]), f"{form}, M={m}: a row depends on the rows beside it"
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gguf_like(tmp_path_factory):
    folder = make_gguf_like_target_dir(tmp_path_factory.mktemp("gguf-like"))
    return load_target(folder, device="cpu", dtype="float32", linear="rowdot"), load_target(folder, device="cpu")


def test_a_target_converted_from_gguf_reads_its_codes(gguf_like):
    fast, ref = gguf_like
    layers = {name: m for name, m in fast.model.named_modules() if isinstance(m, RowDotLinear)}
    assert layers and all(m.compact is not None for m in layers.values())
    assert layers["lm_head"].compact.form == "q8_0"
    assert {m.compact.form for name, m in layers.items() if name != "lm_head"} == {"q4_1"}
    read, full = weight_bytes(fast.model)
    assert read < full / 4
    assert fast.spec == ref.spec  # same weights: same fingerprint
    ids = torch.tensor([prompt_of(30, seed=3)])
    with torch.no_grad():
        torch.testing.assert_close(fast.model(ids).logits, ref.model(ids).logits, rtol=1e-5, atol=1e-5)


def test_its_passes_stay_bitwise_single_steps(gguf_like):
    fast, _ = gguf_like
    rep = pass_invariance(fast, [prompt_of(n, seed=n) for n in (5, 70)], sizes=(1, 2, 5, 8, 17), seed=4)
    assert rep.ok, f"{rep.equal}/{rep.rows} rows equal; first failures {rep.failures[:5]}"


@pytest.mark.slow
def test_the_builtin_target_packs_whole():
    """The built-in target is converted from a Q4_1 GGUF file: every decoder weight q4_1, the tied head q8_0."""
    target = load_target("smollm2-135m", device="cpu", dtype="float32", linear="rowdot")
    forms = [m.compact.form if m.compact is not None else "float32"
             for m in target.model.modules() if isinstance(m, RowDotLinear)]
    assert forms.count("q4_1") == len(forms) - 1 and forms[-1] == "q8_0"
    read, full = weight_bytes(target.model)
    assert read < full / 4

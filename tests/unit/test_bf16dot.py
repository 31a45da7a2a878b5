"""The AVX512-BF16 kernel (`target.bf16dot`) behind `--dtype bfloat16 --linear rowdot`.

Each row of a product is bitwise the row of a one-row product, for every row count up to 17, every form of the
weight (bf16, and the GGUF codes q4_1 and q8_0 that the bf16 weight was rounded from), with and without bias and
on 1 and 2 threads; reading the codes gives bitwise what reading the bf16 weight gives; and the products are the
bf16 products to within the output's rounding; a served draft's layer over the nearest q8_0 codes of its weight
(`RowDotLinear.serve_q8_0`, its inputs quantized to int16 per block: `q8i16dot`) keeps its rows independent,
packs bitwise and is the quantized sum to float32's accumulation. A GGUF-like tiny target loads with it,
reads its codes, keeps its passes bitwise single steps and decodes speculatively token for token as it decodes
plainly; a layer whose codes do not rebuild its bf16 weight reads the weight instead. Each output is its float32 sum
rounded once to nearest even. The two tools that measure the kernel (`tools/pass_anatomy.py`, `tools/kernel_ab.py`)
run end to end on a tiny target. This machine has AVX512-BF16 (`lscpu`), so nothing here
skips on it; a CPU without gets the refusal, tested below.
"""

from __future__ import annotations

import pytest
import torch

from helpers import gguf_dequantized, load_tool, make_gguf_like_target_dir, prompt_of
from specwire.errors import SpecwireError
from specwire.target import bf16dot
from specwire.target.compact import CompactWeight, pack

pytestmark = pytest.mark.skipif(bf16dot.cpu_lacks() is not None, reason=f"this CPU has no AVX512-BF16: {bf16dot.cpu_lacks()}")


def _source(form: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | CompactWeight]:
    """(the bf16 weight, what the kernel reads): the weight itself, or the codes of the float32 weight it rounds."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    if form == "bf16":
        return w.bfloat16(), w.bfloat16()
    w32 = gguf_dequantized(w, form)
    codes = pack(w32, (form,))
    assert codes is not None and codes.form == form
    return w32.bfloat16(), codes


@pytest.mark.parametrize("form", ["bf16", "q4_1", "q8_0"])
@pytest.mark.parametrize("n,k", [(67, 96), (8, 32), (130, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_rows_are_bitwise_independent_of_the_rows_beside_them(form, n, k, bias):
    w16, src = _source(form, n, k)
    b = torch.randn(n).bfloat16() if bias else None
    x = torch.randn(17, k).bfloat16()
    single = [bf16dot.bf16dot(x[i:i + 1], src, b) for i in range(17)]
    for m in range(1, 18):
        y = bf16dot.bf16dot(x[:m], src, b)
        assert all(torch.equal(y[i:i + 1], single[i]) for i in range(m)), f"{form} n={n} k={k}: rows differ at M={m}"
    if form != "bf16":  # the codes give bitwise what the bf16 weight they rebuild gives
        assert torch.equal(bf16dot.bf16dot(x, src, b), bf16dot.bf16dot(x, w16, b))
    ref = x.double() @ w16.double().T + (b.double() if bias else 0)  # shape: [17, n]
    y = bf16dot.bf16dot(x, src, b).double()
    assert ((y - ref).abs() <= 2 ** -7 * ref.abs() + 1e-3).all()  # float32 sums, rounded once to bf16


@pytest.mark.parametrize("n", [8, 7])  # tiles of 4 columns, and a tail of 3 computed one column at a time
@pytest.mark.parametrize("bias", [False, True])
def test_each_output_is_its_float32_sum_rounded_once_to_nearest_even(n, bias):
    """One non-zero input a row makes each output one exact product plus the bias, a single float32 addition, so
    the kernel's output is known: that sum rounded to bf16 as torch rounds it (nearest, ties to even; a NaN stays
    a NaN, a sum past bf16's largest number becomes infinite). The values hit ties both ways, infinities, an
    infinity minus itself and float32's largest number."""
    one, ulp = 1.0, 2.0 ** -7  # bf16's spacing at 1
    w = torch.zeros(n, 32)
    w[:, 5] = torch.tensor([one, one + ulp, -(one + ulp), float("inf"), 3.0, -2.0, 1.5, 2.0 ** 127][:n])
    b = torch.tensor([ulp / 2, ulp / 2, -ulp / 2, float("-inf"), ulp / 4 * 3, 2.0 ** -9, -ulp, 2.0 ** 127][:n])
    x = torch.zeros(4, 32)
    x[:, 5] = torch.tensor([1.0, -1.0, 1.9921875, 0.5])  # bf16 numbers: every product is exact in float32
    w16, x16, b16 = w.bfloat16(), x.bfloat16(), b.bfloat16() if bias else None
    sums = x16.float() @ w16.float().T + (b16.float() if bias else 0)  # one product and the bias: exact order
    want = sums.bfloat16()  # shape: [4, n]
    got = bf16dot.bf16dot(x16, w16, b16)
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert same.all(), f"rounded differently at {same.logical_not().nonzero().tolist()}: {got} against {want}"
    if bias:  # the biases above make ties: 1 + ulp/2 rounds down to 1, 1 + ulp + ulp/2 up to 1 + 2 ulp
        assert got[0, 0].item() == 1.0 and got[0, 1].item() == 1.0 + 2 * ulp and got[0, 3].isnan()


def test_threads_and_shapes_do_not_change_a_row():
    _, src = _source("q4_1", 96, 64)
    x = torch.randn(2, 3, 64).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bf16dot.bf16dot(x, src)
        torch.set_num_threads(2)
        two = bf16dot.bf16dot(x, src)
    finally:
        torch.set_num_threads(before)
    assert one.shape == (2, 3, 96) and torch.equal(one, two)
    assert torch.equal(bf16dot.bf16dot(x.transpose(0, 1), src).transpose(0, 1), one)  # strided input


def test_bad_inputs_are_refused_with_what_was_found():
    w16, src = _source("q4_1", 8, 64)
    with pytest.raises(SpecwireError, match="expected bf16 inputs"):
        bf16dot.bf16dot(torch.randn(1, 64), src)
    with pytest.raises(SpecwireError, match="width 64"):
        bf16dot.bf16dot(torch.randn(1, 32).bfloat16(), src)
    with pytest.raises(SpecwireError, match="multiple of 32"):
        bf16dot.bf16dot(torch.randn(1, 40).bfloat16(), torch.randn(8, 40).bfloat16())


@pytest.fixture(scope="module")
def gguf_like(tmp_path_factory):
    from specwire.target.load import load_target

    folder = make_gguf_like_target_dir(tmp_path_factory.mktemp("gguf-like-bf16"))
    return folder, load_target(folder, device="cpu", dtype="bfloat16", linear="rowdot")


def test_a_bf16_target_reads_the_codes_its_weights_were_rounded_from(gguf_like):
    from specwire.target.fastlinear import RowDotLinear, linear_min_rows, weight_bytes

    _, target = gguf_like
    layers = [m for m in target.model.modules() if isinstance(m, RowDotLinear)]
    assert layers and all(isinstance(m.bf16, CompactWeight) for m in layers)
    assert {m.bf16.form for m in layers} == {"q4_1", "q8_0"}
    read, full = weight_bytes(target.model)
    assert read < 0.5 * full  # about 6 and 9 bits a weight against bf16's 16
    assert linear_min_rows(target.model) == 1  # no row padding


def test_its_passes_are_bitwise_single_steps(gguf_like):
    from specwire.decode.invariance import pass_invariance

    _, target = gguf_like
    rep = pass_invariance(target, [prompt_of(n, seed=n) for n in (5, 37, 70)], sizes=(1, 2, 3, 5, 8, 16, 17), seed=1)
    assert rep.ok, f"{rep.equal}/{rep.rows} rows equal; {rep.failures[:5]}"


@pytest.mark.parametrize("tree", [False, True])
def test_it_decodes_speculatively_as_it_decodes_plainly(gguf_like, tmp_path, tree):
    """With a random draft (few tokens accepted) and with an oracle that proposes the plain answer (multi-token
    verify passes accepted whole): the output is the plain greedy decoding's, token for token."""
    from helpers import OracleProposer, random_tiny_draft
    from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
    from specwire.decode.plain import plain_generate
    from specwire.target.load import load_target

    folder, target = gguf_like
    draft = load_engine_draft(random_tiny_draft(load_target(folder, device="cpu", dtype="float32"), tmp_path / "d"),
                              target)
    for n in (3, 40):
        prompt = prompt_of(n, seed=n)
        ref = plain_generate(target, prompt, max_new_tokens=24, stop_on_eos=False).output_ids
        got = speculative_generate(target, draft, prompt, max_new_tokens=24, tree=tree, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert got.output_ids == ref
        oracle = OracleProposer(prompt, ref, target.spec.vocab_size)
        res = speculative_generate(target, oracle, prompt, max_new_tokens=24, tree=tree, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref and res.extra["accept_length"] > 2


def test_a_layer_whose_codes_do_not_rebuild_its_weight_reads_the_weight():
    from specwire.target.fastlinear import RowDotLinear

    w16, codes = _source("q4_1", 16, 64)
    layer = torch.nn.Linear(64, 16, bias=False)
    layer.weight.data = w16.clone()
    other = RowDotLinear(layer)
    other.serve_bf16(_source("q4_1", 16, 64, seed=1)[1])  # another weight's codes
    assert other.bf16 is layer.weight.data or torch.equal(other.bf16, w16)
    same = RowDotLinear(layer)
    same.serve_bf16(codes)
    assert same.bf16 is codes
    odd = torch.nn.Linear(40, 8, bias=True).bfloat16()  # K % 32 != 0: the weight, zero-padded to 64 k
    m = RowDotLinear(odd)
    m.serve_bf16(None)
    assert m.pad_k == 24 and m.bf16.shape == (8, 64)
    x = torch.randn(3, 40).bfloat16()
    with torch.inference_mode():
        y = m(x)
    ref = x.double() @ odd.weight.double().T + odd.bias.double()
    assert ((y.double() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-3).all()


def test_refused_with_the_reason_where_it_cannot_run(tiny_target, monkeypatch):
    from specwire.target.load import load_target

    monkeypatch.setattr(bf16dot, "_library", lambda: (None, "this CPU lacks avx512_bf16"))
    with pytest.raises(SpecwireError, match="AVX512-BF16 kernel cannot run here: this CPU lacks avx512_bf16"):
        load_target(tiny_target("llama"), device="cpu", dtype="bfloat16", linear="rowdot")
    with pytest.raises(SpecwireError, match="float32 and bf16 CPU kernel"):
        load_target(tiny_target("llama"), device="cpu", dtype="float16", linear="rowdot")


# ---- three-part products: a float32 input split exactly into bf16 parts (a served draft's exact products) -----

@pytest.mark.parametrize("n,k", [(67, 96), (8, 32), (130, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_three_part_rows_are_independent_and_as_exact_as_float32_products(n, k, bias):
    g = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(17, k, generator=g)
    single = [bf16dot.split3dot(x[i:i + 1], w, b) for i in range(17)]
    for m in range(1, 18):
        y = bf16dot.split3dot(x[:m], w, b)
        assert y.dtype == torch.float32
        assert all(torch.equal(y[i:i + 1], single[i]) for i in range(m)), f"n={n} k={k}: rows differ at M={m}"
    ref = x.double() @ w.double().T + (b.double() if bias else 0)  # shape: [17, n]
    scale = x.double().abs() @ w.double().abs().T + (b.double().abs() if bias else 0)  # the terms' size
    bound = 4 * k * 2 ** -24 * scale  # float32 sums of exact products
    assert ((bf16dot.split3dot(x, w, b).double() - ref).abs() <= bound).all()
    rounded = x.bfloat16().double() @ w.double().T + (b.double() if bias else 0)  # x rounded to bf16 first
    assert ((rounded - ref).abs() > bound).any()  # the bound tells the two apart


def test_the_three_parts_sum_to_the_input_exactly():
    """Through an identity weight each output is hi + mid + lo of one input, in the kernel's order: bitwise the
    input, over forty decades of magnitude."""
    k = 64
    x = torch.randn(5, k) * torch.logspace(-20, 20, k)
    eye = torch.eye(k).bfloat16()
    assert torch.equal(bf16dot.split3dot(x, eye), x)


def test_three_part_products_refuse_what_they_do_not_compute():
    w = torch.randn(8, 32).bfloat16()
    with pytest.raises(SpecwireError, match="float32 inputs"):
        bf16dot.split3dot(torch.randn(2, 32).bfloat16(), w)
    with pytest.raises(SpecwireError, match="float32 inputs"):
        bf16dot.split3dot(torch.randn(2, 32), w.float())
    with pytest.raises(SpecwireError, match="multiple of 32"):
        bf16dot.split3dot(torch.randn(2, 40), torch.randn(8, 40).bfloat16())


def test_a_strided_bias_is_read_as_its_values():
    """A bias that is a view with strides is copied contiguous and kept alive while the kernel reads it."""
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(8, 64, generator=g) * 0.05).bfloat16()
    x = torch.randn(3, 64, generator=g)
    strided = torch.randn(16, generator=g)[::2]
    assert not strided.is_contiguous()
    assert torch.equal(bf16dot.split3dot(x, w, strided), bf16dot.split3dot(x, w, strided.contiguous()))
    assert torch.equal(bf16dot.bf16dot(x.bfloat16(), w, strided.bfloat16()),
                       bf16dot.bf16dot(x.bfloat16(), w, strided.bfloat16().contiguous()))


@pytest.mark.parametrize("k", [96, 40])
def test_a_q8_0_draft_layer_reads_the_nearest_codes_and_packs_them_bitwise(k):
    """`RowDotLinear.serve_q8_0` (a served draft's default): float32 inputs through `q8i16dot` over the q8_0 codes
    nearest the (zero-padded) weight, the float32 bias added by the kernel; rows independent of the rows beside them;
    within the codes' half step (and the inputs' int16 half step) of the float32 product; and q|k|v packed
    (`concat_linears`) is bitwise the separate layers, because each row's blocks are its own."""
    import torch.nn as nn

    from specwire.target.compact import nearest_q8_0
    from specwire.target.fastlinear import RowDotLinear, concat_linears, q8_0_linears

    torch.manual_seed(0)
    parts = nn.ModuleList([nn.Linear(k, n) for n in (24, 8, 8)])
    assert q8_0_linears(parts) == 0  # only RowDotLinear layers take it
    layers = [RowDotLinear(m) for m in parts]
    assert all(m.serve_q8_0() for m in layers)
    x = torch.randn(5, k)
    pad = -k % 32
    with torch.no_grad():
        for m, lin in zip(layers, parts):
            codes = nearest_q8_0(torch.nn.functional.pad(lin.weight, (0, pad)))
            want = bf16dot.q8i16dot(torch.nn.functional.pad(x, (0, pad)), codes, lin.bias)
            assert torch.equal(m(x), want) and m.pad_k == pad
            assert all(torch.equal(m(x[i:i + 1]), m(x)[i:i + 1]) for i in range(5))
            ref = x.double() @ lin.weight.double().T + lin.bias.double()
            step = (codes.d.double().max() / 2 * x.abs().double().sum(-1, keepdim=True)
                    + 2 ** -15 * (x.abs().double().amax(-1, keepdim=True) * lin.weight.abs().double().sum(-1))
                    + 2 ** -20 * (x.abs().double() @ lin.weight.abs().double().T + ref.abs()))  # codes, inputs, sums
            assert ((m(x).double() - ref).abs() <= step).all()
        packed = concat_linears(layers)
        assert packed.q8 is not None and packed.split3 is None
        assert torch.equal(packed(x), torch.cat([m(x) for m in layers], dim=-1))
    assert "nearest q8_0 with int16 inputs" in repr(packed)


def _int16_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 as `bf16dot.c` quantizes it (`quantize_block`): (xq [M, K] int64, s [M, K / 32] float32)."""
    blocks = x.view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    live = amax > 1e-30
    up = torch.where(live, torch.tensor(32767.0) / amax, torch.zeros(()))  # float32 division, as the kernel's
    xq = torch.round(blocks * up[..., None]).clamp(-32768, 32767)  # torch.round: to nearest even, as cvtps
    return xq.to(torch.int64).view_as(x), torch.where(live, amax / 32767, torch.zeros(()))


@pytest.mark.parametrize("threads", [1, 2])
def test_the_int16_product_is_the_quantized_sum_and_each_row_is_its_own(threads):
    """`q8i16dot`: each output is its rows' int16 blocks times the codes, each block's sum exact and scaled by d s, to
    within float32's accumulation (against a float64 sum over the exact integer block sums); a row is bitwise the
    row of a one-row product for every row count to 17 and N not a multiple of the 4-column tile; a block of zeros
    and a block below 1e-30 read as zeros (no NaN), a block near float32's largest stays finite."""
    from specwire.target.compact import nearest_q8_0

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        N, K = 13, 96
        codes = nearest_q8_0(torch.randn(N, K, generator=g) * 0.1)
        bias = torch.randn(N, generator=g)
        x = torch.randn(17, K, generator=g) * torch.logspace(-3, 3, 17)[:, None]
        x[3, 32:64] = 0
        x[4, :32] = 1e-31 * torch.randn(32, generator=g)
        x[5, 64:] = 1e37 * torch.randn(32, generator=g).clamp(-3, 3)
        y = bf16dot.q8i16dot(x, codes, bias)
        for m in range(1, 18):
            assert torch.equal(bf16dot.q8i16dot(x[:m], codes, bias), y[:m])
        assert all(torch.equal(bf16dot.q8i16dot(x[i:i + 1], codes, bias), y[i:i + 1]) for i in range(17))
        assert torch.isfinite(y).all()
        xq, s = _int16_blocks(x)
        pairs = (codes.codes.to(torch.int64).view(1, N, -1, 16, 2) * xq.view(17, 1, -1, 16, 2)).sum(-1)  # a lane's
        ds = (codes.d.double()[None] * s.double()[:, None]).float().double()  # [M, N, KB]; d s rounds to float32
        ref = (pairs.sum(-1).double() * ds).sum(-1) + bias.double()  # each block's sum exact, in float64
        tol = 2 ** -21 * ((pairs.abs().sum(-1).double() * ds).sum(-1) + bias.double().abs())  # the lanes' float32 sums
        assert ((y.double() - ref).abs() <= tol).all()
        assert torch.equal(y[4], bf16dot.q8i16dot(torch.cat([torch.zeros(32), x[4, 32:]])[None], codes, bias)[0])
    finally:
        torch.set_num_threads(old)


def test_the_int16_product_refuses_what_it_does_not_take():
    from specwire.target.compact import nearest_q8_0

    codes = nearest_q8_0(torch.randn(8, 64))
    for x, w, what in ((torch.randn(2, 64).bfloat16(), codes, "bfloat16"), (torch.randn(2, 64), torch.randn(8, 64), "float32 weight"),
                       (torch.randn(2, 40), codes, "width 64")):
        with pytest.raises(SpecwireError, match=what):
            bf16dot.q8i16dot(x, w)


def test_the_pass_anatomy_tool_splits_a_pass_and_measures_the_peak(tmp_path):
    """tools/pass_anatomy.py (docs/BENCHMARKS.md) runs end to end on a tiny GGUF-like target: the parts of each
    timed pass add up to it, a row's instruction count is the products' N * K / 32, and the attention it timed is
    registered as it was before."""
    import json

    from specwire.target.fastlinear import RowDotLinear

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specwire.target.attention import ATTENTION_NAME, invariant_attention

    path = make_gguf_like_target_dir(tmp_path)
    attention = {k: ALL_ATTENTION_FUNCTIONS[k] for k in list(ALL_ATTENTION_FUNCTIONS.keys())}
    load_tool("pass_anatomy").main(["--target", str(path), "--tokens", "1,2,4", "--reps", "1", "--out", str(tmp_path / "o")])
    assert all(ALL_ATTENTION_FUNCTIONS[k] is f for k, f in attention.items())  # its timer taken off again
    assert ALL_ATTENTION_FUNCTIONS[ATTENTION_NAME] is invariant_attention
    r = json.loads((tmp_path / "o" / "results.json").read_text())
    for T in ("1", "2", "4"):
        parts = r["ms"]["products"][T] + r["ms"]["attention"][T] + r["ms"]["other"][T]
        assert abs(parts - r["ms"]["timed pass"][T]) < 1e-2 and r["ms"]["products"][T] > 0 and r["ms"]["attention"][T] > 0
    from specwire.decode.kernels import load_decoding_target

    model = load_decoding_target(str(path), device="cpu", dtype="bfloat16", linear="rowdot").model
    layers = [m for m in model.modules() if isinstance(m, RowDotLinear) and m.bf16 is not None]
    assert r["products"] == len(layers) > 0
    assert r["vdpbf16ps_per_row"] == sum(m.out_features * (m.in_features + m.pad_k) // 32 for m in layers)
    assert r["peak_vdpbf16ps_per_s"] > 0 and "products_share_of_peak" in r
    assert "of the peak" in (tmp_path / "o" / "results.md").read_text()
    assert (tmp_path / "o" / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_the_kernel_ab_tool_finds_the_same_logits_with_the_committed_kernel(tmp_path, capsys):
    """tools/kernel_ab.py builds the kernels of a commit (here HEAD) beside this tree's and swaps them pass by pass
    on one target: the logits are bitwise equal (this tree's kernels keep every chain), both rows are timed, and the
    libraries are put back after."""
    from specwire.target import rowdot

    path = make_gguf_like_target_dir(tmp_path)
    loaders = (bf16dot.library, rowdot.library)
    load_tool("kernel_ab").main(["--before", "HEAD", "--target", str(path), "--tokens", "1,3", "--reps", "1"])
    out = capsys.readouterr().out
    assert "Logits bitwise equal for every T: **yes**" in out
    assert "| HEAD |" in out and "| this tree |" in out
    assert (bf16dot.library, rowdot.library) == loaders

"""Real peers load our exports and compute the same logits as our draft (fp32, CPU).

speculators (vLLM's checkpoint format): `Eagle3DraftModel.from_pretrained` on the speculators export
with `sdpa` attention; SpecForge: its `LlamaForCausalLMEagle3` on the SGLang export. Both are
compared at TTT step 0 and step 1 (step 1 feeds back the draft's own pre-norm hidden state, with
teacher-forced next tokens, positions + 1, and attention over step 0's keys causally plus its own
key: the training-time-test pattern both peers use).

Install (CPU, no CUDA torch pulled): speculators==0.9.0 and its import-time needs with --no-deps
(openai hs-connectors loguru sniffio datasets dill multiprocess pandas pyarrow xxhash), and
specforge==0.2.0 with --no-deps. Without them these tests skip with the reason.
"""

from __future__ import annotations

import pytest
import torch

from specwire.draft.checkpoint import load_draft
from specwire.draft.model import causal_attend, masked_attend
from specwire.interop.convert import export_draft

from helpers import make_native

T = 9  # sequence length of the comparison
ATOL = 1e-5


def _inputs(draft, seed: int = 1):
    """Random stand-ins for the captured target states, next-token ids and positions."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(1, T, draft.config.fc_in_features, generator=g)  # shape: [1, T, 3 * H_target]
    ids = torch.randint(0, draft.config.vocab_size, (1, T), generator=g)
    return fused, ids, torch.arange(T)[None]


def _ours_two_steps(draft, fused, ids, pos):
    """Our draft's logits at TTT steps 0 and 1, with the peers' step-1 attention pattern."""
    saved = {}

    def attend0(q, k, v):
        saved["k"], saved["v"] = k, v
        return causal_attend(q, k, v)

    def attend1(q, k, v):
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        mask = torch.cat([causal, torch.eye(T, dtype=torch.bool)], dim=1)[None, None]  # shape: [1, 1, T, 2T]
        return masked_attend(q, torch.cat([saved["k"], k], dim=2), torch.cat([saved["v"], v], dim=2), mask)

    with torch.no_grad():
        o0 = draft(draft.fuse(fused), ids, pos, attend0)
        ids1 = torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], dim=1)  # teacher forcing: next tokens, zero padded
        o1 = draft(o0.hidden, ids1, pos + 1, attend1)
    return o0.logits, o1.logits, ids1


# ---- speculators ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_speculators_loads_the_export_and_matches_logits(tmp_path, tiny_llama_target, tiny_target, norm_before_residual):
    eagle3 = pytest.importorskip("speculators.models.eagle3", reason="speculators 0.9 not installed (pip install --no-deps speculators==0.9.0 + deps)")
    target_dir = str(tiny_target("llama"))
    nat = make_native(tmp_path, tiny_llama_target, norm_before_residual=norm_before_residual)
    export_draft(nat, tmp_path / "sp", fmt="speculators", verifier=target_dir, embeddings_from=target_dir)

    config = eagle3.Eagle3SpeculatorConfig.from_pretrained(tmp_path / "sp")
    config.transformer_layer_config._attn_implementation = "sdpa"
    peer = eagle3.Eagle3DraftModel.from_pretrained(str(tmp_path / "sp"), config=config).eval()
    assert peer.config.norm_before_residual is norm_before_residual
    assert peer.config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    ours = load_draft(nat).attach_embeddings(tiny_llama_target.parts.embed)
    mine = ours.state_dict()
    theirs = peer.state_dict()
    for k, v in mine.items():  # every tensor we wrote is the one the peer holds
        assert torch.equal(theirs[k].to(v.dtype), v), k
    assert torch.equal(theirs["embed_tokens.weight"], tiny_llama_target.parts.embed.weight)

    fused, ids, pos = _inputs(ours)
    logits = []
    hook = peer.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.detach()))
    try:
        with torch.no_grad():
            peer(hidden_states=fused, input_ids=ids, document_ids=torch.zeros(1, T, dtype=torch.long), position_ids=pos, ttt_steps=2)
    finally:
        hook.remove()
    l0, l1, _ = _ours_two_steps(ours, fused, ids, pos)
    assert len(logits) == 2
    torch.testing.assert_close(logits[0], l0, atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], l1, atol=ATOL, rtol=0)
    assert l0.abs().max() > 0.1 and not torch.allclose(l0, l1)  # a real comparison, not of zeros


# ---- SpecForge ------------------------------------------------------------------------------------------

def test_specforge_loads_the_sglang_export_and_matches_logits(tmp_path, tiny_llama_target, tiny_target, monkeypatch):
    sf = pytest.importorskip("specforge.modeling.draft.llama3_eagle", reason="specforge not installed (pip install --no-deps specforge==0.2.0)")
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    # SpecForge wraps its rotary helper in torch.compile; on CPU that costs a minute of inductor build for
    # identical maths, so run it eagerly.
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    target_dir = str(tiny_target("llama"))
    nat = make_native(tmp_path, tiny_llama_target)
    export_draft(nat, tmp_path / "sg", fmt="sglang", embeddings_from=target_dir)
    export_draft(nat, tmp_path / "sg-lean", fmt="sglang")

    config = LlamaConfig.from_pretrained(tmp_path / "sg")
    # Built from the config and loaded strictly: with transformers 5.19, SpecForge 0.2.0's from_pretrained
    # (pinned to transformers 5.8.1) leaves its rope cache buffers uninitialised.
    peer = sf.LlamaForCausalLMEagle3(config, attention_backend="sdpa").eval()
    peer.load_state_dict(load_file(str(tmp_path / "sg" / "model.safetensors")), strict=True)  # no missing, no unexpected
    lean = peer.load_state_dict(load_file(str(tmp_path / "sg-lean" / "model.safetensors")), strict=False)
    assert lean.missing_keys == ["embed_tokens.weight"] and lean.unexpected_keys == []  # the target's, by design
    peer.load_embedding(target_dir)  # SpecForge's own way to take the embedding from the target

    ours = load_draft(nat).attach_embeddings(tiny_llama_target.parts.embed)
    fused, ids, pos = _inputs(ours)
    l0, l1, ids1 = _ours_two_steps(ours, fused, ids, pos)
    with torch.no_grad():
        h = peer.project_hidden_states(fused)
        mask = peer.prepare_decoder_attention_mask(torch.ones(1, T, dtype=torch.bool), h, 1, T, 0)
        cache = [[], []]  # SpecForge's TTT key/value cache
        h0 = peer.backbone(peer.embed_input_ids(ids), h, cache, mask, pos, use_cache=False)
        p0 = peer.compute_logits(h0)
        h1 = peer.backbone(peer.embed_input_ids(ids1), h0, cache, mask, pos, use_cache=False)
        p1 = peer.compute_logits(h1)
    torch.testing.assert_close(p0, l0, atol=ATOL, rtol=0)
    torch.testing.assert_close(p1, l1, atol=ATOL, rtol=0)
    assert torch.equal(peer.d2t, ours.d2t) and torch.equal(peer.t2d, ours.t2d)

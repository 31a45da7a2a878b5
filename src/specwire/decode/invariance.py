"""Is a verify pass bitwise what plain decoding computes? The check behind the word "lossless".

Scope: `pass_invariance`, which runs chain and tree verify passes of given sizes on a target and compares
every row's logits, bitwise, with single-step decoding of that row's path from the same KV cache.
Does not make anything invariant (`target.attention`, `target.fastlinear`) nor time anything.

A row of a chain pass of T tokens must equal step j of decoding those T tokens one by one; a node of a
tree pass must equal the last step of decoding its root-to-node path. The tree passes use random
topologies (each node's parent drawn among the earlier nodes), fed exactly as the engine feeds them:
positions by depth and the engine's 4D tree mask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specwire.decode.tree import DraftTree, pass_mask
from specwire.target.load import Target
from specwire.target.passes import padded_pass, pass_rows


@dataclass
class InvarianceReport:
    rows: int = 0  # rows compared
    equal: int = 0  # rows bitwise equal to single-step decoding
    failures: list[str] = field(default_factory=list)  # "chain T=6 prompt 1 row 3" ...

    @property
    def ok(self) -> bool:
        return self.rows > 0 and self.equal == self.rows

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def random_tree(size: int, vocab: int, generator: torch.Generator, device) -> DraftTree:
    """A root plus size-1 nodes, each child of a uniformly drawn earlier node."""
    parents = [-1] + [int(torch.randint(0, i, (), generator=generator)) for i in range(1, size)]
    tokens = torch.randint(0, vocab, (size,), generator=generator).to(device)
    return DraftTree(tokens=tokens, parents=parents)


def _steps(model, cache, tokens: list[int], start: int, device) -> list[torch.Tensor]:
    """Logits of decoding `tokens` one at a time after `start` cached positions, as plain decoding's steps run
    (`target.passes.padded_pass`); the cache is cropped back after."""
    out, rows = [], pass_rows(model, cache)
    for j, tok in enumerate(tokens):
        ids = torch.tensor([[tok]], device=device)
        pos = torch.tensor([[start + j]], device=device)
        out.append(padded_pass(model, ids, cache, rows, positions=pos)[0, -1])
    cache.crop(start)
    return out


@torch.inference_mode()
def pass_invariance(target: Target, prompts: list[list[int]], *, sizes=(2, 6, 16), tree: bool = True,
                    seed: int = 0) -> InvarianceReport:
    """Compare chain passes (and tree passes when `tree`) of every size in `sizes` with single steps."""
    from specwire.target.kvcache import decoding_cache

    model, dev = target.model, target.device
    g = torch.Generator().manual_seed(seed)
    rep = InvarianceReport()
    for pi, prompt in enumerate(prompts):
        cache = decoding_cache(model)
        model(input_ids=torch.tensor([prompt], device=dev), past_key_values=cache, use_cache=True, logits_to_keep=1)
        past = len(prompt)
        kinds = ["chain", "tree"] if tree else ["chain"]
        for kind in kinds:
            for T in sizes:
                if kind == "chain":
                    t = DraftTree(tokens=torch.randint(0, target.info.vocab_size, (T,), generator=g).to(dev),
                                  parents=list(range(-1, T - 1)))
                    mask, positions = None, None
                else:
                    t = random_tree(T, target.info.vocab_size, g, dev)
                    eager = model.config._attn_implementation == "eager"
                    mask = pass_mask(t, past, additive=target.dtype if eager else None)
                    positions = (t.positions() + past)[None]
                logits = padded_pass(model, t.tokens[None], cache, pass_rows(model, cache), mask=mask,
                                     positions=positions)[0]  # shape: [T, V]
                cache.crop(past)
                leaves = [i for i in range(T) if not t.children[i]]
                done: set[int] = set()
                for leaf in leaves:
                    path = t.path(leaf)
                    ref = _steps(model, cache, t.tokens[path].tolist(), past, dev)
                    for node, row in zip(path, ref):
                        if node in done:
                            continue
                        done.add(node)
                        rep.rows += 1
                        if torch.equal(row, logits[node]):
                            rep.equal += 1
                        else:
                            rep.failures.append(f"{kind} T={T} prompt {pi} node {node}")
    return rep

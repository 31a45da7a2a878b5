"""Draft trees: the structure one verification pass checks (pure, no models).

Owns: `DraftTree` (node tokens, parents, depths, in the EAGLE form of `tree_mask` + `positions` +
`retrieve_indices`), building a chain, and EAGLE-2's selection of a dynamic tree from scored
candidates (Li et al., EAGLE-2, 2024: keep the `budget` candidates of highest cumulative draft
log-probability). Does not run the draft (`engine`) nor decide acceptance (`verify`).

Node numbering, used everywhere in decoding: node 0 is the *root*, the last token the target has
already produced (it is fed to the target in the verification pass but is not a draft token);
nodes 1..N are draft tokens in topological order (a parent always has a smaller index than its
children), siblings in the order they are tried (most likely first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """A root plus N draft tokens. Host-side lists hold the structure; tensors live on `device`."""

    tokens: torch.Tensor  # shape: [N+1] long, target vocab ids; tokens[0] = root
    parents: list[int]  # [N+1] parent node index; parents[0] = -1
    q: torch.Tensor | None = None  # shape: [N+1, V_target] law each node was drawn from (row 0 unused); None = deterministic
    depth: list[int] = field(init=False)  # [N+1] root depth 0
    children: list[list[int]] = field(init=False)  # children of each node, in try order

    def __post_init__(self):
        n = len(self.parents)
        if self.tokens.shape != (n,):
            raise ValueError(f"DraftTree: tokens shape {tuple(self.tokens.shape)} != ({n},)")
        if n == 0 or self.parents[0] != -1:
            raise ValueError("DraftTree: node 0 must be the root (parent -1)")
        self.depth = [0] * n
        self.children = [[] for _ in range(n)]
        for i in range(1, n):
            p = self.parents[i]
            if not 0 <= p < i:
                raise ValueError(f"DraftTree: node {i} has parent {p}; parents must precede children")
            self.depth[i] = self.depth[p] + 1
            self.children[p].append(i)
        self._cache: dict[str, torch.Tensor] = {}

    @property
    def size(self) -> int:
        """Nodes in the verification pass, root included (N+1)."""
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @property
    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (a causal mask is then exact)."""
        return all(p == i - 1 for i, p in enumerate(self.parents) if i)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def positions(self) -> torch.Tensor:
        """Depth of each node: its position offset from the root. shape: [N+1] long."""
        if "pos" not in self._cache:
            self._cache["pos"] = torch.tensor(self.depth, dtype=torch.long, device=self.device)
        return self._cache["pos"]

    def tree_mask(self) -> torch.Tensor:
        """mask[i, j] = node j is node i or an ancestor of it. shape: [N+1, N+1] bool."""
        if "mask" not in self._cache:
            n = self.size
            m = torch.zeros(n, n, dtype=torch.bool)
            for i in range(n):
                m[i, i] = True
                p = self.parents[i]
                if p >= 0:
                    m[i] |= m[p]
            self._cache["mask"] = m.to(self.device)
        return self._cache["mask"]

    def path(self, node: int) -> list[int]:
        """Nodes from the root to `node`, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def retrieve_indices(self) -> torch.Tensor:
        """One row per leaf: the root-to-leaf node indices, padded with -1. shape: [leaves, max_depth+1]."""
        if "ri" not in self._cache:
            leaves = [i for i in range(self.size) if not self.children[i]]
            width = self.max_depth + 1
            rows = [self.path(leaf) for leaf in leaves]
            rows = [r + [-1] * (width - len(r)) for r in rows]
            self._cache["ri"] = torch.tensor(rows, dtype=torch.long, device=self.device)
        return self._cache["ri"]

    def parents_tensor(self) -> torch.Tensor:
        """parents with the root's -1 replaced by 0 (safe for gathers). shape: [N+1] long."""
        if "par" not in self._cache:
            self._cache["par"] = torch.tensor([max(p, 0) for p in self.parents], dtype=torch.long, device=self.device)
        return self._cache["par"]


def pass_mask(tree: DraftTree, past: int, *, additive: torch.dtype | None = None) -> torch.Tensor:
    """The 4D mask of a verify pass over `tree` after `past` cached positions: every node sees the cached prefix
    and its ancestors. shape: [1, 1, N+1, past+N+1]; bool (True = may attend), or additive in dtype `additive`."""
    m = tree.tree_mask()
    m = torch.cat([torch.ones(m.shape[0], past, dtype=torch.bool, device=m.device), m], dim=1)[None, None]
    if additive is not None:
        return torch.zeros(m.shape, dtype=additive, device=m.device).masked_fill(~m, torch.finfo(additive).min)
    return m


def root_only(root: torch.Tensor) -> DraftTree:
    """A tree with no draft tokens (a plain one-token pass). root: [] or [1] long."""
    return DraftTree(tokens=root.reshape(1), parents=[-1])


def chain_tree(root: torch.Tensor, draft_tokens: torch.Tensor, q: torch.Tensor | None = None) -> DraftTree:
    """root [] + draft_tokens [k] -> a chain; q: [k, V] laws of the draft tokens, or None."""
    tokens = torch.cat([root.reshape(1), draft_tokens.reshape(-1)])  # shape: [k+1]
    if q is not None:
        q = torch.cat([torch.zeros_like(q[:1]), q])  # shape: [k+1, V], row 0 unused
    return DraftTree(tokens=tokens, parents=list(range(-1, len(tokens) - 1)), q=q)


def select_tree(root: torch.Tensor, cand_tokens: torch.Tensor, cand_parents: list[int], cand_scores: torch.Tensor,
                budget: int) -> DraftTree:
    """EAGLE-2 selection: keep the `budget` candidates of highest cumulative score, as a DraftTree.

    cand_tokens [C] (target ids), cand_parents [C] (index of the parent candidate, -1 for a root
    child; parents precede children), cand_scores [C] (cumulative draft log-probability, so a child
    never scores above its parent). A stable sort breaks ties in favour of earlier candidates, so the
    kept set always contains each kept node's parent. Kept nodes keep their candidate order, which is
    topological and, among siblings, most likely first.
    """
    C = len(cand_parents)
    budget = min(budget, C)
    order = torch.sort(cand_scores.float(), descending=True, stable=True).indices[:budget]
    keep = sorted(order.tolist())
    node_of = {c: i + 1 for i, c in enumerate(keep)}  # candidate index -> node index
    parents = [-1]
    for c in keep:
        p = cand_parents[c]
        if p != -1 and p not in node_of:
            raise ValueError(f"select_tree: candidate {c} kept without its parent {p} (scores not monotone?)")
        parents.append(0 if p == -1 else node_of[p])
    idx = torch.tensor(keep, dtype=torch.long, device=cand_tokens.device)
    tokens = torch.cat([root.reshape(1), cand_tokens[idx]])  # shape: [budget+1]
    return DraftTree(tokens=tokens, parents=parents)

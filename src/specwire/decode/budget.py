"""The speculation budget chosen by measured cost: `auto`.

Scope: `Budget` (draft depth, branching and tokens verified per pass; depth 0 = no speculation), the
acceptance model (`AcceptanceModel`: the draft's acceptance per position, top-1 and top-k, with live
corrections), the cost model (`CostModel`: target pass ms by pass size, draft step ms by width, per-round
overhead, learnt live per pass size), `choose_budget`, which returns the budget of highest expected tokens
per second within a SpecConfig's caps, and `Planner`, which picks each round's budget from them (replans,
probes after plain steps, exploring a close runner-up). Pure: no models, no clocks. The engine feeds it
measurements (`decode.kernels` for the target's cost curve, the engine for draft costs, pass and round
times, and live acceptance).

The model. For a chain of depth k whose draft token j is accepted with probability a_j given that
tokens 0..j-1 were, a round yields on average
    E(k) = 1 + a_0 + a_0 a_1 + ... + a_0 ... a_{k-1}     tokens (the bonus token included)
and costs  C(k) = target(k + 1) + k * draft(1) + overhead  ms. A tree of depth k, branching w and n
draft tokens gives the target's token at depth j more chances: with t_j the chance that it is among
the draft's top-`topk` tokens (measured by `specwire eval`), top-w is interpolated between a_j (w = 1) and
t_j (w = topk), and scaled by how much of the top-w fan the n tokens can hold along a path of depth k
(the n - k tokens beyond one spine, spread over k depths, w - 1 per depth for a full fan):
    b_j = a_j + (t_j - a_j) * (w - 1) / (topk - 1) * min(1, (n - k) / ((w - 1) k))
and C = target(n + 1) + draft(1) + (k - 1) draft(w) + overhead. No speculation (k = 0) gives E = 1 at
C = target(1). `auto` picks the budget with the largest E / C; ties go to the smaller budget.

Live costs: the curve was measured once, on a machine whose speed drifts (other jobs, context length,
clock), and a few passes a size on a shared machine can bend its shape by 10-20%. Each timed target pass
moves the ratio (observed / curve ms) of its own pass size; each timed round moves the overhead (what the
scaled target and the draft do not explain). A size not yet timed takes the ratio of the timed sizes beside
it (`CostModel.ratio`; `scale`, their mean, is what reports show), so plain steps and speculative rounds
are compared at today's speed, and a slower machine scales both sides, not only the speculative one. A
reading more than `OUTLIER` times off the estimate it moves is clipped to that factor first: without the
clip, a stall in a few of the passes of a rarely run size left its ratio at 2.9 in a full HumanEval run,
pricing it out for good, and a stalled round can price speculation out until the next probe.

Exploring: a pass size `auto` never runs keeps the ratio of the sizes it does run, so a curve that
underrates the size it runs (a wide tree, say) would never be corrected against the chain it does not
run. `Planner` therefore, every other replan, runs for one replan period a budget whose pass size has
been timed fewer than `KNOWN_PASSES` times, if the model puts it within `EXPLORE_MARGIN` of the best
(`runner_up`: the size farthest from those timed, so the shape is learnt across the range first). That
costs a few rounds, at most that margin below the best, for each size near enough to matter, once: what
was learnt is carried from one request to the next. If the machine's speed drifts, the ratio of a size not
run lately goes stale: after a slowdown those sizes look cheaper than they are, so `auto` runs them and times
them again; after a speed-up they look dearer, and the size it runs keeps a place it would have kept anyway
(a uniform change leaves the order of budgets as it was).

Live corrections: the engine reports, per draft position, how often it was reached and accepted under
the budget it ran. The model keeps, per position, the posterior of a Beta-like update with
`PRIOR_ROUNDS` pseudo-rounds at the modelled rate of the budgets that ran, and scales every budget, chain
or tree, by posterior / modelled rate at that position (a draft that misses in a tree misses in a chain).
The engine carries these counts from one request to the next (`AcceptanceModel.carried`): the offline
tree model is an estimate (on the shipped draft it expects 0.50 at a tree's third position, where live
rounds accept 0.28), and a request of a few dozen rounds is too short to learn that alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ROUNDS = 16.0  # weight of the offline acceptance against live rounds
LEARN_RATE = 0.2  # weight of one timed pass or round in the learnt scale, ratios and overhead (an EMA)
REPLAN_EVERY = 4  # rounds between two budget choices
PROBE_AFTER = 32  # plain steps before `auto` speculates again for one replan period
KNOWN_PASSES = 8  # timed passes of a size after which its ratio is trusted (it is no longer explored)
EXPLORE_MARGIN = 0.15  # a runner-up is explored if the model expects at least 1 - this of the best's tokens/s
OUTLIER = 2.0  # a timed pass or round reading more than this factor off its estimate is clipped to it
DEFAULT_ACCEPTANCE = (0.3, 0.25, 0.2, 0.2, 0.2)  # a cautious prior for a draft with no acceptance.json
DEFAULT_ACCEPTANCE_TOPK = (0.5, 0.45, 0.4, 0.4, 0.4)


@dataclass(frozen=True)
class Budget:
    """One speculation shape. num_steps 0 = plain decoding; topk 1 = chain (num_draft_tokens = num_steps)."""

    num_steps: int
    topk: int = 1
    num_draft_tokens: int = 0

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def pass_tokens(self) -> int:
        """Tokens in the verify pass: the root plus the draft tokens."""
        return 1 + (self.num_steps if self.is_chain else self.num_draft_tokens)

    def label(self) -> str:
        if self.num_steps == 0:
            return "none"
        if self.is_chain:
            return f"chain {self.num_steps}"
        return f"tree {self.num_steps}x{self.topk}, {self.num_draft_tokens} tokens"


@dataclass
class CostModel:
    """What a round costs, in ms."""

    target_ms: dict[int, float]  # pass size T -> ms of one target pass over T tokens (the measured curve)
    draft_ms: dict[int, float]  # width w -> ms of one draft step over w rows
    overhead_ms: float = 0.0  # per speculative round, outside target and draft (bookkeeping)
    passes: dict[int, list[float]] = field(default_factory=dict)  # pass size T -> [observed / curve ms, passes timed]

    def curve(self, T: int) -> float:
        """The measured curve's ms for a pass over T tokens (unscaled)."""
        known = sorted(self.target_ms)
        for t in known:
            if t >= T:
                return self.target_ms[t]
        return self.target_ms[known[-1]] * T / known[-1]  # past the curve: assume linear growth

    @property
    def scale(self) -> float:
        """The target's passes now against the curve's: the timed sizes' ratios, weighted by passes timed (1.0 before
        any)."""
        n = sum(c for _, c in self.passes.values())
        return sum(r * c for r, c in self.passes.values()) / n if n else 1.0

    def ratio(self, T: int) -> float:
        """Live ms / curve ms for a pass over T tokens: its own if timed, else interpolated linearly in T between
        the timed sizes beside it (the nearest one past either end), else 1.0."""
        timed = sorted(self.passes)
        if not timed:
            return 1.0
        if T in self.passes:
            return self.passes[T][0]
        below, above = [t for t in timed if t < T], [t for t in timed if t > T]
        if not below or not above:
            return self.passes[(below or above)[-1 if below else 0]][0]
        lo, hi = below[-1], above[0]
        return self.passes[lo][0] + (self.passes[hi][0] - self.passes[lo][0]) * (T - lo) / (hi - lo)

    def target(self, T: int) -> float:
        return self.curve(T) * self.ratio(T)

    def known(self, T: int) -> int:
        """How many passes over T tokens have been timed."""
        return int(self.passes[T][1]) if T in self.passes else 0

    def learn_pass(self, T: int, ms: float) -> None:
        """One timed target pass over T tokens: moves T's ratio towards observed / curve (an EMA at LEARN_RATE; a
        size timed for the first time starts from the ratio it was given until then). The reading is first
        clipped to within a factor OUTLIER of that ratio, so one stalled pass (a page fault,
        the garbage collector, another job's burst) moves it by at most LEARN_RATE x (OUTLIER - 1), while a lasting
        change is still followed within a few passes."""
        curve = self.curve(T)
        if curve > 0 and ms > 0:
            r, n = self.passes.get(T, (self.ratio(T), 0))
            self.passes[T] = [(1 - LEARN_RATE) * r + LEARN_RATE * _clip(ms / curve, r), n + 1]

    def learn_round(self, b: Budget, ms: float) -> None:
        """One timed speculative round: what the model (scaled target, draft) does not explain is overhead, taken
        as at most OUTLIER x the overhead learnt so far, or a tenth of what the model explains if that is more (a
        stalled round must not price speculation out for the request)."""
        explained = self.round_ms(b) - self.overhead_ms
        residual = min(ms - explained, max(OUTLIER * self.overhead_ms, 0.1 * explained))
        self.overhead_ms = max(0.0, (1 - LEARN_RATE) * self.overhead_ms + LEARN_RATE * residual)

    def draft(self, w: int) -> float:
        known = sorted(self.draft_ms)
        for t in known:
            if t >= w:
                return self.draft_ms[t]
        return self.draft_ms[known[-1]] * w / known[-1]

    def round_ms(self, b: Budget) -> float:
        if b.num_steps == 0:
            return self.target(1)
        if b.is_chain:
            return self.target(b.pass_tokens) + b.num_steps * self.draft(1) + self.overhead_ms
        return self.target(b.pass_tokens) + self.draft(1) + (b.num_steps - 1) * self.draft(b.topk) + self.overhead_ms


@dataclass
class AcceptanceModel:
    """Acceptance per draft position: offline (from eval) with live corrections per family."""

    top1: list[float]  # a_j
    topk: list[float]  # t_j, the target's token among the draft's `k` best
    k: int = 4
    live: list[list[float]] = field(default_factory=list)  # per position j: [modelled rate summed, reached, accepted]

    def __post_init__(self):
        if len(self.top1) != len(self.topk) or not self.top1:
            raise ValueError("AcceptanceModel: top1 and topk need the same, non-zero number of positions")

    @property
    def depth(self) -> int:
        return len(self.top1)

    def modelled(self, b: Budget) -> list[float]:
        """Per-position acceptance of budget b from the offline figures alone."""
        if b.is_chain:
            return list(self.top1[:b.num_steps])
        w = min(b.topk, self.k)
        fan = (w - 1) / (self.k - 1) if self.k > 1 else 1.0
        cover = min(1.0, (b.num_draft_tokens - b.num_steps) / ((b.topk - 1) * b.num_steps))
        return [a + (t - a) * fan * max(0.0, cover) for a, t in zip(self.top1[:b.num_steps], self.topk[:b.num_steps])]

    def rates(self, b: Budget) -> list[float]:
        """Per-position acceptance of budget b: modelled, scaled by what live rounds of its family showed."""
        rates = self.modelled(b)
        if self.live:
            for j, r in enumerate(rates):
                modelled_sum, reached, accepted = self.live[j]
                if reached and modelled_sum > 0:
                    prior = modelled_sum / reached
                    posterior = (prior * PRIOR_ROUNDS + accepted) / (PRIOR_ROUNDS + reached)
                    rates[j] = min(1.0, r * posterior / prior)
        return rates

    def carried(self, limit: float) -> list[list[float]]:
        """The live counts, to start the next request of the same draft and target from: a copy, each position's
        counts scaled down to at most `limit` rounds reached (so the newest rounds keep moving the correction)."""
        out = []
        for modelled_sum, reached, accepted in self.live:
            f = min(1.0, limit / reached) if reached else 1.0
            out.append([modelled_sum * f, reached * f, accepted * f])
        return out

    def observe(self, b: Budget, reached: list[int], accepted: list[int]) -> None:
        """Live counts of one or more rounds run with budget b: per position, rounds reaching it, accepting."""
        if not self.live:
            self.live = [[0.0, 0, 0] for _ in range(self.depth)]
        modelled = self.modelled(b)
        for j in range(min(len(reached), len(modelled))):
            self.live[j][0] += modelled[j] * reached[j]
            self.live[j][1] += reached[j]
            self.live[j][2] += accepted[j]


def _clip(reading: float, estimate: float) -> float:
    """`reading` brought to within a factor OUTLIER of `estimate` (unchanged where the estimate is not positive)."""
    if estimate <= 0:
        return reading
    return min(max(reading, estimate / OUTLIER), estimate * OUTLIER)


def expected_tokens(rates: list[float]) -> float:
    """1 + a_0 + a_0 a_1 + ...: tokens a round yields on average, bonus included."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


@dataclass(frozen=True)
class Choice:
    budget: Budget
    tokens_per_round: float
    ms_per_round: float

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.tokens_per_round / self.ms_per_round if self.ms_per_round > 0 else 0.0


def candidates(max_steps: int, max_topk: int, max_tokens: int, *, tree: bool, depth: int,
               speculate: bool = False) -> list[Budget]:
    """Every budget within the caps: none (unless `speculate`), chains of depth 1..max_steps, trees of depth
    2..max_steps, branching 2..max_topk and max(depth, ...) .. max_tokens tokens. Depth is also capped by the
    acceptance profile's length."""
    k_max = min(max_steps, depth)
    out = ([] if speculate and k_max else [Budget(0)]) + [Budget(k) for k in range(1, k_max + 1)]
    if tree:
        for k in range(2, k_max + 1):
            for w in range(2, max_topk + 1):
                for n in range(k + 1, max_tokens + 1):
                    out.append(Budget(k, w, n))
    return out


def evaluate(b: Budget, acceptance: AcceptanceModel, cost: CostModel) -> Choice:
    rates = acceptance.rates(b) if b.num_steps else []
    return Choice(b, expected_tokens(rates), cost.round_ms(b))


def score(acceptance: AcceptanceModel, cost: CostModel, *, max_steps: int, max_topk: int, max_tokens: int,
          tree: bool, speculate: bool = False) -> list[Choice]:
    """Every budget within the caps (`candidates` order), with its expected tokens and cost."""
    return [evaluate(b, acceptance, cost)
            for b in candidates(max_steps, max_topk, max_tokens, tree=tree, depth=acceptance.depth, speculate=speculate)]


def best_of(choices: list[Choice]) -> Choice:
    """The choice of highest expected tokens per second (ties: the first)."""
    best = choices[0]
    for c in choices[1:]:
        if c.tokens_per_s > best.tokens_per_s * (1 + 1e-9):
            best = c
    return best


def choose_budget(acceptance: AcceptanceModel, cost: CostModel, *, max_steps: int, max_topk: int, max_tokens: int,
                  tree: bool, speculate: bool = False) -> Choice:
    """The budget of highest expected tokens per second (ties: the first, i.e. the smaller, in `candidates` order).
    `speculate`: the best that speculates (a probe: what plain decoding cannot measure)."""
    return best_of(score(acceptance, cost, max_steps=max_steps, max_topk=max_topk, max_tokens=max_tokens, tree=tree,
                         speculate=speculate))


def runner_up(choices: list[Choice], best: Choice, cost: CostModel) -> Choice | None:
    """A budget worth running for one replan period to time its pass size: among `choices` (`score`'s) whose size
    has been timed fewer than KNOWN_PASSES times and that the model expects at least 1 - EXPLORE_MARGIN of `best`'s
    tokens per second from, the one whose size lies farthest from every size already timed (then the faster), so
    that a few explorations learn the curve's shape across the range, not one size beside another. None if there
    is none, or if `best` is plain decoding (the probes look past that)."""
    if best.budget.num_steps == 0:
        return None
    timed = list(cost.passes) or [best.budget.pass_tokens]
    out, out_key = None, None
    for c in choices:
        T = c.budget.pass_tokens
        if T == best.budget.pass_tokens or cost.known(T) >= KNOWN_PASSES:
            continue
        if c.tokens_per_s < (1 - EXPLORE_MARGIN) * best.tokens_per_s:
            continue
        key = (min(abs(T - t) for t in timed), c.tokens_per_s)
        if out_key is None or key[0] > out_key[0] or (key[0] == out_key[0] and key[1] > out_key[1] * (1 + 1e-9)):
            out, out_key = c, key
    return out


@dataclass
class Planner:
    """Which budget each round runs under `auto`: the best by the model, chosen again every REPLAN_EVERY rounds;
    after PROBE_AFTER plain steps, the best that speculates (a probe, since plain steps teach nothing about
    acceptance: a draft that lost on a hard passage may win on the next); and, every other replan, the
    `runner_up` if there is one (exploring a pass size not yet timed). The caller times what ran and feeds
    `cost` and `acceptance`."""

    acceptance: AcceptanceModel
    cost: CostModel
    max_steps: int
    max_topk: int
    max_tokens: int
    tree: bool
    current: Budget | None = None
    rounds: int = 0
    replans: int = 0
    plain_run: int = 0  # plain steps since the last speculative round
    probes: int = 0
    explored: int = 0  # replan periods spent on a runner-up
    used: dict[str, int] = field(default_factory=dict)  # rounds per budget label

    def next(self) -> Budget:
        if self.current is None or self.rounds % REPLAN_EVERY == 0:
            caps = dict(max_steps=self.max_steps, max_topk=self.max_topk, max_tokens=self.max_tokens, tree=self.tree)
            probe = self.current is not None and self.current.num_steps == 0 and self.plain_run >= PROBE_AFTER
            choices = score(self.acceptance, self.cost, **caps, speculate=probe)
            choice = best_of(choices)
            other = runner_up(choices, choice, self.cost) if self.replans % 2 and not probe else None
            self.current = (other or choice).budget
            self.probes += probe
            self.explored += other is not None
            self.replans += 1
        self.rounds += 1
        self.plain_run = self.plain_run + 1 if self.current.num_steps == 0 else 0
        self.used[self.current.label()] = self.used.get(self.current.label(), 0) + 1
        return self.current

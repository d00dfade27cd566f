"""What a draft token is worth and what it costs: the acceptance model and the step-cost model
that decide, each step, which draft-tree nodes to verify (scheduler process).

A node's worth is the probability that verification accepts it (the expected number of extra
tokens it yields); its cost is the forward time one more row adds to the step, mostly weight
reads at small batch and attention over the request's context at long ones. A node pays when
its probability per unit of cost beats the step's tokens per unit of time: nodes are taken in
that order across the whole batch until the next one does not (`select_nodes`), so a
compute-bound batch, or text that does not repeat itself, verifies nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ngram import NgramIndex

# priors, before any verification is seen: the first draft token's acceptance by the length of
# the suffix match that proposed it, and a later token's given the one before it was accepted
FIRST_PRIOR = (0.15, 0.3, 0.45, 0.55, 0.6)  # match lengths 1, 2, 3, 4, 5+
NEXT_PRIOR = 0.75
GLOBAL_WEIGHT = 8.0  # pseudo-observations behind each prior
# the global estimates weigh the last few hundred tested nodes (a server's mix of requests
# changes: JSON extraction copies, stories do not), a request's own multiplier all of its own
GLOBAL_DECAY = 0.995
REQUEST_WEIGHT = 2.0  # pseudo-observations behind a request's own multiplier (1.0)
MAX_PROB = 0.98


@dataclass
class Ratio:
    """An estimate (num + weight * prior) / (den + weight): observations on top of a prior worth
    `weight` of them; with `decay` < 1 older observations count less (it follows a changing
    mix of requests)."""

    prior: float
    weight: float
    decay: float = 1.0
    num: float = 0.0
    den: float = 0.0

    @property
    def value(self) -> float:
        return (self.num + self.weight * self.prior) / (self.den + self.weight)

    def add(self, hit: float, expected: float) -> None:
        self.num = self.num * self.decay + hit
        self.den = self.den * self.decay + expected


@dataclass
class RequestAcceptance:
    """A request's acceptance relative to the global model (1.0 = as predicted), for its first
    draft tokens and for continuations: JSON values copied from a document beat the average,
    a story that only echoes single words does worse."""

    first: Ratio = field(default_factory=lambda: Ratio(1.0, REQUEST_WEIGHT))
    next: Ratio = field(default_factory=lambda: Ratio(1.0, REQUEST_WEIGHT))


class DraftState:
    """A request's drafting state: its n-gram index and its acceptance relative to the model."""

    __slots__ = ("acceptance", "index")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.index = NgramIndex(min_n, max_n)
        self.acceptance = RequestAcceptance()


class AcceptanceModel:
    """Calibrated probabilities that a draft node is accepted given its parent was.

    A node is proposed by one or more candidate continuations; its `share` is the part of its
    parent's candidates (weighted) that pass through it. P(first token) = f(match) * share and
    P(later token) = g * share, each times the request's own multiplier. f and g are ratio
    estimates over every tested node (one whose parent was accepted): accepted nodes over the
    probability mass predicted for them, so they converge to what verification really accepts.
    """

    def __init__(self) -> None:
        self.first = [Ratio(p, GLOBAL_WEIGHT, GLOBAL_DECAY) for p in FIRST_PRIOR]
        self.next = Ratio(NEXT_PRIOR, GLOBAL_WEIGHT, GLOBAL_DECAY)

    def _bucket(self, match: int) -> int:
        return min(max(match, 1), len(self.first)) - 1

    def first_weight(self, match: int) -> float:
        """A candidate's weight among its siblings: the acceptance of its first token."""
        return self.first[self._bucket(match)].value

    def prob(self, depth: int, match: int, share: float, req: RequestAcceptance) -> float:
        if depth == 1:
            p = self.first[self._bucket(match)].value * req.first.value
        else:
            p = self.next.value * req.next.value
        return min(MAX_PROB, p * share)

    def observe(
        self, depth: int, match: int, share: float, accepted: bool, req: RequestAcceptance
    ) -> None:
        """One tested node: its parent was accepted, it was or was not."""
        hit = 1.0 if accepted else 0.0
        if depth == 1:
            base = self.first[self._bucket(match)]
            mine = req.first
        else:
            base, mine = self.next, req.next
        base.add(hit, share * mine.value)
        mine.add(hit, share * base.value)


# a step that computes more rows than this, or a longer extend, is a prefill: its per-row cost
# is not a decode row's, so it does not teach the step-cost model
COST_MAX_ROWS = 256
COST_MAX_EXTEND = 64
KEYS_UNIT = 1024.0


class StepCostModel:
    """Forward milliseconds of a step: a + b * rows + c * attended / 1024, where `attended` sums
    the keys each computed row attends over. Fitted online by exponentially weighted least
    squares with a ridge towards the prior, so it follows the machine and the batch size it
    runs at (a GPU's row is nearly free at small batch, a CPU's is not).
    """

    DECAY = 0.99

    def __init__(self, base_ms: float, row_ms: float, key_ms: float, learn: bool) -> None:
        self.prior = (base_ms, row_ms, key_ms)
        self.theta = [base_ms, row_ms, key_ms]
        self.learn = learn
        # ridge: the prior counts as a few observations of typical feature sizes
        self._ridge = (2.0, 50.0, 50.0)
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3

    @property
    def base_ms(self) -> float:
        return max(self.theta[0], 1e-3)

    def row_ms(self, context: int) -> float:
        """What one more row attending over `context` keys adds to a step."""
        return max(self.theta[1], 1e-4) + max(self.theta[2], 0.0) * context / KEYS_UNIT

    def predict_ms(self, rows: int, attended: float) -> float:
        return (
            self.base_ms
            + max(self.theta[1], 1e-4) * rows
            + max(self.theta[2], 0.0) * (attended / KEYS_UNIT)
        )

    def observe(self, rows: int, attended: float, ms: float) -> None:
        if not self.learn:
            return
        x = (1.0, float(rows), attended / KEYS_UNIT)
        d = self.DECAY
        for i in range(3):
            self._xy[i] = d * self._xy[i] + x[i] * ms
            row = self._xx[i]
            for j in range(3):
                row[j] = d * row[j] + x[i] * x[j]
        a = [
            [self._xx[i][j] + (self._ridge[i] if i == j else 0.0) for j in range(3)]
            for i in range(3)
        ]
        b = [self._xy[i] + self._ridge[i] * self.prior[i] for i in range(3)]
        solved = _solve3(a, b)
        if solved is not None:
            self.theta = solved


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b (3 x 3, Gaussian elimination with partial pivoting), None if singular."""
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, 3):
            f = m[r][col] / m[col][col]
            for c in range(col, 4):
                m[r][c] -= f * m[col][c]
    x = [0.0] * 3
    for r in (2, 1, 0):
        x[r] = (m[r][3] - sum(m[r][c] * x[c] for c in range(r + 1, 3))) / m[r][r]
    return x


@dataclass(order=True)
class NodeOffer:
    """One draft node on offer to the step: its probability per millisecond (the sort key), the
    probability, the millisecond it costs, and where it lives."""

    neg_ratio: float
    prob: float = field(compare=False)
    cost_ms: float = field(compare=False)
    owner: int = field(compare=False)  # index of the request's candidate tree
    node: int = field(compare=False)  # node id in that tree
    parent: int = field(compare=False)


def select_nodes(
    offers: list[NodeOffer], tokens: float, step_ms: float, budget: int
) -> list[NodeOffer]:
    """The offers that raise the step's expected tokens per millisecond, best ratio first: a
    node is taken while its probability per millisecond beats the step's (tokens: what the step
    yields without drafts, step_ms: what it costs), and only after its parent (node 0, a tree's
    root, is always there). At most `budget` nodes."""
    offers.sort()
    taken: list[NodeOffer] = []
    have: set[tuple[int, int]] = set()
    for o in offers:
        if len(taken) >= budget:
            break
        if o.parent != 0 and (o.owner, o.parent) not in have:
            continue
        if o.prob * step_ms <= o.cost_ms * tokens:
            break  # sorted by ratio: no later offer pays either
        taken.append(o)
        have.add((o.owner, o.node))
        tokens += o.prob
        step_ms += o.cost_ms
    return taken


def select_drafts(
    offers: list[NodeOffer], tokens: float, plain_ms: float, drafted_ms: float, budget: int
) -> list[NodeOffer]:
    """`select_nodes` for a step that pays a fixed price for carrying any draft: `plain_ms` is
    the step without drafts, `drafted_ms` the same rows in a step with drafts (on a GPU the
    plain decode step replays a CUDA graph and a drafted one runs eagerly, several times
    dearer). Nodes are taken as by `select_nodes` from the drafted step's cost; the drafts are
    kept only if they then beat the plain step's tokens per millisecond."""
    base = max(drafted_ms, plain_ms)
    taken = select_nodes(offers, tokens, base, budget)
    gain = sum(o.prob for o in taken)
    cost = sum(o.cost_ms for o in taken)
    if taken and (tokens + gain) * plain_ms <= tokens * (base + cost):
        return []
    return taken

"""The mixed recursion solved fast: a proven closed form where memory suffices, the exact DP below.

The problem (see :mod:`bincheck.schedule.mixed`)::

    R(n, s) = 0                                  if n <= L[s]
    R(n, s) = min_{1<=j<n} j + R(j, s) + R(n-j, s-1)       (R(n, 0) = inf for n > L[0])

**Chain formula (proven).** Suppose ``L`` is nondecreasing, ``L[0] >= 1``, and its increments differ
by at most one (``L[u+1]-L[u] <= L[v+1]-L[v] + 1`` for all ``u, v``; every ``L`` from
``leaf_lengths`` has increments ``floor(S/T)`` or one more). Write ``P(k..s) = L[k] + ... + L[s]``.
Then for ``1 <= n <= P(0..s)``::

    R(n, s) = max(0, n - L[k]),       k = max{k : P(k..s) >= n},

and the advance ``j = n - P(k..s-1)`` attains it: a chain that stores a state, tapes the left part
whole and moves one slot down, ending in a last segment of ``L[k]`` steps, the only steps never run
plain. Proof, by induction on ``s`` and then ``n``. *Lemma*: ``R(n+1, s) >= R(n, s) + 1`` for
``n >= L[s]`` (take an optimal split ``j`` of ``n+1``; if its right part ``n+1-j`` exceeds
``L[s-1]``, induction on row ``s-1`` makes ``j`` one cheaper for ``n``; otherwise ``j-1`` is).
*Upper bound*: ``1 <= j <= L[s]`` by the choice of ``k``, and the right part ``P(k..s-1)`` has the
same ``k`` in row ``s-1``. *Lower bound*, for every split ``j`` (``x = n-j``, ``k'`` its ``k`` in row
``s-1``, ``k_j`` that of ``j`` in row ``s``): (i) ``j <= L[s]``, ``x <= P(0..s-1)``: ``P(k'..s) >= n``
so ``k' <= k`` and the cost is ``>= n - L[k']``. (ii) ``j <= L[s] < n - P(0..s-1)``: by the lemma
``j + R(n-j, s-1)`` does not grow as ``j`` rises to ``n - P(0..s-1) <= L[s]``, which is case (i).
(iii) ``j > L[s]``: then ``x <= P(0..s-1)`` and the cost is ``>= n + j - L[k_j] - L[k']``, so we need
``j >= L[k_j] + L[k'] - L[k]``. This is clear if ``k' <= k`` or if ``j > L[s] + L[s-1]``
(``k_j <= s-2``); else ``k_j = s-1`` and maximality of ``k`` gives ``j >= 1 + L[s] + P(k+1..k'-1)``,
which suffices when the increment ``L[k+1]-L[k]`` (for ``k' = k+1``) or ``L[k']-L[k'-1]`` (for
``k' >= k+2``) is at most one or two more than ``L[s]-L[s-1]``: the increment hypothesis. Without
it the formula is false (``L = [1, 6, 7]``, ``n = 14``: formula 13, optimum 10).

Measured, not needed by the proof: it agrees with the reference DP on every cell of every grid in
``tests/test_mixed.py`` and the smallest optimal advance is the one :meth:`ChainTable.split` returns.

**Below the chain region** (``n > P(0..s)``: fewer than about ``sqrt(2 n T / S)`` slots) some steps
must be recomputed twice or more, and the closed form does not apply (R is not convex there, and no
formula of Revolve's kind holds). Rows whose ``L[s]`` is 1 are Revolve's (rows ``0..s`` then see
only unit leaves), so ``R = t(n, s)`` from :mod:`~bincheck.schedule.binomial`, proven; in particular
a tape that never fits costs nothing to plan. Other cells run the exact DP, rows built on first use
upwards from the highest Revolve row: O(n^2) per row at C speed, like the reference (about 0.6 s
for 1000 steps and 21 slots). A plan whose whole problem lies in the chain region (every budget from
about 1 % of ``n * T`` up at n = 10^4) never builds a row: O(slots) memory, O(log slots) per query.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import add

from .binomial import optimal_plain_steps, split as revolve_split

INF = float("inf")


def chain_formula_holds(leaves: list[int]) -> bool:
    """Whether ``leaves`` meets the chain formula's hypothesis (see the module docstring)."""
    steps = [b - a for a, b in zip(leaves, leaves[1:])]
    return leaves[0] >= 1 and (not steps or (min(steps) >= 0 and max(steps) - min(steps) <= 1))


class ChainTable:
    """R(n, s) and an optimal advance for ``1 <= n <= seq_len``, ``0 <= s <= len(leaves) - 1``.

    Same interface as :class:`~bincheck.schedule.mixed.ReferenceTable`: :meth:`cost` and
    :meth:`split`. Cells in the chain region are answered by the closed form; the others by exact
    DP rows, built once, only when such a cell is asked for.
    """

    def __init__(self, seq_len: int, leaves: list[int]) -> None:
        self.seq_len, self.leaves = seq_len, leaves
        self.prefix = [0, *accumulate(leaves)]          # prefix[k] = L[0] + ... + L[k-1]
        self.chain = chain_formula_holds(leaves)
        self._rows: dict[int, list[float]] = {}         # exact DP rows, once built

    def region(self, s: int) -> int:
        """The largest ``n`` for which row ``s`` needs no DP: ``P(0..s)`` (or ``L[s]``)."""
        return self.prefix[s + 1] if self.chain else self.leaves[s]

    def _last_leaf(self, n: int, s: int) -> int:
        """``k = max{k : P(k..s) >= n}`` for ``n <= P(0..s)``."""
        return bisect_right(self.prefix, self.prefix[s + 1] - n) - 1

    def cost(self, n: int, s: int) -> float:
        """R(n, s): the fewest plain step evaluations (``inf`` if ``s == 0`` and ``n > L[0]``)."""
        if n <= self.leaves[s]:
            return 0
        if n <= self.region(s):
            return n - self.leaves[self._last_leaf(n, s)]
        if s == 0:
            return INF
        if self.leaves[s] == 1:                         # rows 0..s are Revolve's: t(n, s)
            return optimal_plain_steps(n, s)
        return self._row(s)[n]

    def split(self, n: int, s: int) -> int:
        """0 if the segment is taped whole; else the smallest optimal advance ``j``."""
        L = self.leaves
        if n <= L[s]:
            return 0
        if n <= self.region(s):
            # Any j <= L[s] whose right part still ends on a leaf as long as L[k] is optimal; the
            # smallest lets the right part run down the whole plateau of L values equal to L[k].
            low = bisect_left(L, L[self._last_leaf(n, s)])
            return max(1, n - (self.prefix[s] - self.prefix[low]))
        if L[s] == 1:
            return n - 1 if s == 1 else revolve_split(n, s)
        row, prev = self._row(s), self._row(s - 1)
        target = row[n]
        for j in range(1, n):
            if j + row[j] + prev[n - j] == target:
                return j
        raise AssertionError("no split attains the table's optimum")   # pragma: no cover

    def _row(self, s: int) -> list[float]:
        """Row ``s`` of the exact DP (every ``n <= seq_len``), built on first use.

        Row ``s`` reads row ``s-1``, so rows are built upwards from the highest one that needs no
        DP below it: row 0, or a Revolve row (``L[s] == 1``, filled from the closed form). Only
        rows that some cell outside the chain region reaches are built (if row ``s-1`` needs no
        DP up to ``seq_len``, neither does row ``s``).
        """
        N, L, rows = self.seq_len, self.leaves, self._rows
        base = s
        while base > 0 and base not in rows and L[base] > 1:
            base -= 1
        for t in range(base, s + 1):
            if t in rows:
                continue
            if t == 0 or L[t] == 1:
                rows[t] = [self.cost(n, t) for n in range(N + 1)]
                continue
            prev, cap = rows[t - 1], self.region(t)
            row = [0] * (N + 1)
            shifted = [INF] * (N + 1)              # shifted[j] = j + R(j, t)
            for n in range(1, N + 1):
                if n <= cap:
                    row[n] = self.cost(n, t)
                else:
                    row[n] = min(map(add, shifted[1:n], prev[n - 1:0:-1]))
                shifted[n] = n + row[n]
            rows[t] = row
        return rows[s]

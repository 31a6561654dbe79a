"""The mixed recursion solved fast: proven closed forms where memory suffices, the exact DP below.

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

**Second band (proven).** Just below the chain region a closed form still holds, for any
nondecreasing ``L``. In a schedule whose top-level right spine stores slots ``s, s-1, ..., k+1``
and ends in a segment at slot ``k``, at most ``L[k]`` steps run no plain step (that last segment)
and at most ``P(k..s)`` run at most one (it, plus each left part's own last segment, at most
``L[t]`` at slot ``t``), so its cost is at least ``(n - L[k]) + (n - P(k..s))``. Hence ``R(n, s) >= 2n - M[s]`` with
``M[s] = max_k L[k] + P(k..s)``. Let ``k*`` be the smallest maximiser and ``d = n - P(k*..s)``. A
left part at slot ``t`` of ``L[t] + e`` steps, reversed by a chain that stays on ``L[t]``'s plateau
(down to ``first(t)``, the lowest slot with the same ``L``), costs ``L[t] + 2e`` for
``e <= (t - first(t)) * L[t]``; so whenever ``d <= sum_{k* < t <= s} (t - first(t)) * L[t]`` the
spine with such left parts costs ``P(k*+1..s) + 2d = 2n - M[s]``, and::

    R(n, s) = 2n - M[s]        (advance j = L[s] + min((s - first(s)) * L[s], d)).

**Revolve rows (proven).** If ``L[s] == 1``, rows ``0..s`` see only unit leaves: ``R = t(n, s)``
(:mod:`~bincheck.schedule.binomial`). A tape that never fits costs nothing to plan.

**Everything else** runs the exact DP, rows built on first use upwards from the highest row below
that needs none, every closed-form cell filled from its formula: O(n^2) per row at C speed, like
the reference. There R is not convex and no formula of Revolve's kind holds (the level capacities
``B(s, l) = B(s, l-1) + B(s-1, l)`` only give a lower bound). Where each part applies, for n steps
of the RNN cell (S = 64 KiB, T = 140 KiB; budget as a share of ``n * T``): chain region from 2.97 %
(n = 10^3), 0.95 % (10^4), 0.30 % (10^5); second band from 2.33 %, 0.75 %, 0.24 %. Below that the
DP is slow: about 0.7 s at 10^3 steps and 1 %, but 400 s at 10^4 and 0.6 %. A plan whose whole
problem has a closed form never builds a row: O(slots) memory, O(log slots) per query.

Measured, not needed by the proofs: both formulas and the DP agree with the reference on every
cell of every grid in ``tests/test_mixed.py``, and in the chain region :meth:`ChainTable.split`
returns the reference's (smallest) optimal advance.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import add

from .binomial import optimal_plain_steps, split as revolve_split

INF = float("inf")
_BIG = 2**31 - 1          # "infeasible" in 32-bit DP rows


def chain_formula_holds(leaves: list[int]) -> bool:
    """Whether ``leaves`` meets the chain formula's hypothesis (see the module docstring)."""
    steps = [b - a for a, b in zip(leaves, leaves[1:])]
    return leaves[0] >= 1 and (not steps or (min(steps) >= 0 and max(steps) - min(steps) <= 1))


class ChainTable:
    """R(n, s) and an optimal advance for ``1 <= n <= seq_len``, ``0 <= s <= len(leaves) - 1``.

    Same interface as :class:`~bincheck.schedule.mixed.ReferenceTable`: :meth:`cost` and
    :meth:`split`. ``leaves`` must be nondecreasing with ``leaves[0] >= 1``. Cells covered by a
    closed form (chain region, second band, Revolve rows) cost O(log) each; the others read exact
    DP rows, built on first use.
    """

    def __init__(self, seq_len: int, leaves: list[int]) -> None:
        if leaves[0] < 1 or any(b < a for a, b in zip(leaves, leaves[1:])):
            raise ValueError(f"leaf lengths must be nondecreasing and >= 1; got {leaves[:8]}...")
        self.seq_len, self.leaves = seq_len, leaves
        self.prefix = [0, *accumulate(leaves)]          # prefix[k] = L[0] + ... + L[k-1]
        self.chain = chain_formula_holds(leaves)
        self._band: tuple[list[int], list[int], list[int]] | None = None
        self._rows: dict[int, array] = {}               # exact DP rows, once built

    @property
    def dp_rows(self) -> int:
        """How many exact DP rows have been built (0 while every query had a closed form)."""
        return len(self._rows)

    def row_bytes_needed(self, n: int, s: int) -> int:
        """Bytes of the exact-DP rows that answering R(n, s) builds (0 with a closed form); the
        rows a walk of the schedule from (n, s) reads are among them."""
        if self.dp_work(n, s) == 0:
            return 0
        base = s
        while base > 0 and base not in self._rows and self.leaves[base] > 1:
            base -= 1
        N = self.seq_len
        cell = 4 if N * (N + 1) < _BIG else 8
        return (s - base + 1) * (sys.getsizeof(array("i")) + cell * (N + 1))

    def drop_rows(self) -> None:
        """Free the exact-DP rows (queries that need them rebuild them)."""
        self._rows.clear()

    @property
    def nbytes(self) -> int:
        """Bytes the built DP rows hold (4 per cell: see :meth:`_row`)."""
        return sum(sys.getsizeof(row) for row in self._rows.values())

    def dp_work(self, n: int, s: int) -> int:
        """Element operations the exact DP would spend to answer R(n, s): 0 with a closed form."""
        L = self.leaves
        if n <= L[s] or n <= self.region(s) or L[s] == 1 or (s and self.in_second_band(n, s)):
            return 0
        base = s
        while base > 0 and base not in self._rows and L[base] > 1:
            base -= 1
        return (s - base) * self.seq_len ** 2 // 2

    def lower_bound(self, n: int, s: int) -> int:
        """A proven lower bound on R(n, s): ``2n - M[s]`` (module docstring, second band)."""
        return max(0, n - self.leaves[s], 2 * n - self.second_band()[0][s])

    def region(self, s: int) -> int:
        """The largest ``n`` for which row ``s`` needs no DP: ``P(0..s)`` (or ``L[s]``)."""
        return self.prefix[s + 1] if self.chain else self.leaves[s]

    def _last_leaf(self, n: int, s: int) -> int:
        """``k = max{k : P(k..s) >= n}`` for ``n <= P(0..s)``."""
        return bisect_right(self.prefix, self.prefix[s + 1] - n) - 1

    def second_band(self) -> tuple[list[int], list[int], list[int]]:
        """Per row ``s``: ``M[s] = max_k L[k] + P(k..s)``, the smallest ``k*`` attaining it, and
        ``F[s+1] = sum_{t<=s} (t - first(L[t])) * L[t]`` (plateau capacity, cumulative)."""
        if self._band is None:
            L, P = self.leaves, self.prefix
            peak, kstar, free, first, best = [], [], [0], 0, -INF
            for t, v in enumerate(L):
                if v != L[first]:
                    first = t
                free.append(free[-1] + (t - first) * v)
                if v - P[t] > best:
                    best, top = v - P[t], t
                peak.append(P[t + 1] + best)
                kstar.append(top)
            self._band = peak, kstar, free
        return self._band

    def in_second_band(self, n: int, s: int) -> bool:
        """Whether the second-band formula gives R(n, s) (meaningful for ``n > region(s)``)."""
        peak, kstar, free = self.second_band()
        k = kstar[s]
        return 0 <= n - (self.prefix[s + 1] - self.prefix[k]) <= free[s + 1] - free[k + 1]

    def cost(self, n: int, s: int) -> float:
        """R(n, s): the fewest plain step evaluations (``inf`` if ``s == 0`` and ``n > L[0]``)."""
        if n <= self.leaves[s]:
            return 0
        if n <= self.region(s):
            return n - self.leaves[self._last_leaf(n, s)]
        if s == 0:
            return INF
        if self.in_second_band(n, s):
            return 2 * n - self.second_band()[0][s]
        if self.leaves[s] == 1:                         # rows 0..s are Revolve's: t(n, s)
            return optimal_plain_steps(n, s)
        return self._row(s)[n]

    def split(self, n: int, s: int) -> int:
        """0 if the segment is taped whole; else an optimal advance ``j`` (the smallest one in the
        chain region and in DP rows)."""
        L = self.leaves
        if n <= L[s]:
            return 0
        if n <= self.region(s):
            # Any j <= L[s] whose right part still ends on a leaf as long as L[k] is optimal; the
            # smallest lets the right part run down the whole plateau of L values equal to L[k].
            low = bisect_left(L, L[self._last_leaf(n, s)])
            return max(1, n - (self.prefix[s] - self.prefix[low]))
        if self.in_second_band(n, s):
            # A full leaf plus as much of the excess as its plateau chain holds (module docstring).
            _, kstar, free = self.second_band()
            excess = n - (self.prefix[s + 1] - self.prefix[kstar[s]])
            return L[s] + min(free[s + 1] - free[s], excess)
        if L[s] == 1:
            return n - 1 if s == 1 else revolve_split(n, s)
        row, prev = self._row(s), self._row(s - 1)
        target = row[n]
        for j in range(1, n):
            if j + row[j] + prev[n - j] == target:
                return j
        raise AssertionError("no split attains the table's optimum")   # pragma: no cover

    def _row(self, s: int) -> array:
        """Row ``s`` of the exact DP (every ``n <= seq_len``), built on first use.

        Row ``s`` reads row ``s-1``, so rows are built upwards from the highest one that needs no
        DP below it (row 0, or a Revolve row: ``L[s] == 1``). Cells with a closed form are filled
        from it; only the others scan their splits. Nothing is built until such a cell is asked for.
        Rows are 32-bit integers while every ``n + R(n, s)`` fits (``R(n, s) <= n(n-1)/2``, so up
        to 46340 steps; the exact DP is never run that long), with row 0's infeasible cells held
        as ``_BIG``, which no sum with them can undercut (``R(1, 0) = 0`` is always a candidate).
        """
        N, L, rows = self.seq_len, self.leaves, self._rows
        code, big = ("i", _BIG) if N * (N + 1) < _BIG else ("d", INF)
        base = s
        while base > 0 and base not in rows and L[base] > 1:
            base -= 1
        for t in range(base, s + 1):
            if t in rows:
                continue
            if t == 0 or L[t] == 1:
                row = array(code, [0]) * (N + 1)      # allocated exactly (row_bytes_needed)
                for n in range(N + 1):
                    c = self.cost(n, t)
                    row[n] = big if c == INF else int(c)
                rows[t] = row
                continue
            prev, row = rows[t - 1], array(code, [0]) * (N + 1)
            shifted = array(code, [0]) * (N + 1)       # shifted[j] = j + R(j, t)
            for n in range(1, N + 1):
                if n <= self.region(t) or self.in_second_band(n, t):
                    row[n] = int(self.cost(n, t))
                else:
                    row[n] = min(map(add, shifted[1:n], prev[n - 1:0:-1]))
                shifted[n] = n + row[n]
            rows[t] = row
        return rows[s]

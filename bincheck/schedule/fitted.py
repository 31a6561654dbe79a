"""Revolve over groups of a chain's stages, its snapshots fitted to a budget by the exact model.

:class:`~.chain.ChainPlan` plans a long chain over a few dozen groups; where one group's tape
does not fit beside the snapshots (a recorded RNN of 1000 steps in 64 groups: each tapes 16
steps), the DP has no plan. :class:`~.grouped.GroupedRevolve` runs Revolve over many groups
within a closed-form bound, which prices every group at the worst group's tape, back and
adjoint held together (on that RNN: 16 snapshots where 25 fit). :class:`FittedRevolve` runs
the same binomial schedule over the groups of :func:`~.chain.group`, and counts its snapshots
by the exact model instead: :func:`~.chain.chain_cost` of the actions, on the stages, must fit
the budget; its prediction is that cost (the same model, and so comparable, as ChainPlan's).
"""

from __future__ import annotations

from typing import Iterator

from .actions import Action
from .binomial import Plan, repetitions
from .chain import Chain, chain_cost, group, grouped, minimum_memory
from .grouped import body_bounds, group_counts, on_stages

# the most sweeps of a plan that :meth:`FittedRevolve.fit` prices (chain_cost walks every stage
# of every advance): Revolve's repetitions over the groups
MAX_SWEEPS = 16


class FittedRevolve:
    """Revolve with ``slots`` snapshots (cut 0 included) over the groups ``bounds[g]..
    bounds[g+1]-1`` of ``chain``'s stages; ``seconds``, ``peak_bytes``, ``plain_stages`` and
    ``taped_stages`` are :func:`~.chain.chain_cost`'s. Iterate it for the actions (in stage
    indices)."""

    def __init__(self, chain: Chain, bounds: list[int], slots: int) -> None:
        self.bounds, self.stages, self.seq_len = bounds, len(bounds) - 1, chain.n
        self.plan = Plan(self.stages, min(slots, self.stages))
        self.slots = self.plan.num_ckpts
        cost = chain_cost(chain, iter(self))
        self.seconds, self.peak_bytes = cost.seconds, cost.peak_bytes
        self.plain_stages, self.taped_stages = cost.plain_stages, cost.taped_stages

    @classmethod
    def fit(cls, chain: Chain, memory: int, bounds: list[int]) -> "FittedRevolve | None":
        """The plan over ``bounds`` with the most snapshots whose exact peak is within
        ``memory`` bytes, from a first guess (each snapshot beyond the one that
        :func:`~.chain.minimum_memory` of the groups holds costs at most the largest boundary)
        down; None if one snapshot does not fit, or the plan sweeps the chain more than
        ``MAX_SWEEPS`` times (pricing it would take longer than it is worth: one snapshot over
        2835 groups is 4 million group evaluations)."""
        coarse = grouped(chain, bounds)
        big = max(int(coarse.cuts.max()), 1)
        room = memory - minimum_memory(coarse)
        if room < 0:
            return None
        slots = 1 + room // big
        while slots >= 1:
            if repetitions(len(bounds) - 1, slots) > MAX_SWEEPS:
                return None
            plan = cls(chain, bounds, slots)
            if plan.peak_bytes <= memory:
                return plan
            # each snapshot fewer frees at most the largest boundary's bytes
            slots = min(plan.slots, slots) - max(1, -(-(plan.peak_bytes - memory) // big))
        return None

    @classmethod
    def best(cls, chain: Chain, memory: int, smallest: int = 64,
             largest: int = 4096) -> "FittedRevolve | None":
        """The fitted plan of least predicted time over the group counts ``smallest, sqrt(2)
        * smallest, ...`` up to ``largest`` (the chain's own stages where fewer), from the
        first that fits until three in a row are slower than the best; None if none fits.
        Coarser groups recompute less where the snapshots stay as many (fewer, larger groups
        in the same number of Revolve's sweeps), finer ones tape less at once."""
        found, worse = None, 0
        for count in group_counts(chain.n, smallest, largest):
            plan = cls.fit(chain, memory, group(chain, count))
            if plan is None:
                continue
            if found is None or plan.seconds < found.seconds:
                found, worse = plan, 0
            else:
                worse += 1
                if worse == 3:
                    break
        for bounds in body_bounds(chain, smallest, largest):    # a loop's whole bodies
            plan = cls.fit(chain, memory, bounds)
            if plan is not None and (found is None or plan.seconds < found.seconds):
                found = plan
        return found

    def release(self) -> None:
        """Nothing to drop: the plan is its bounds and Revolve's closed form."""

    def __iter__(self) -> Iterator[Action]:
        return on_stages(self.plan, self.bounds)


__all__ = ["FittedRevolve"]

"""Errors every front end raises with the same meaning (and the same class, so one ``except``
serves whichever framework a user runs)."""


class NondeterministicStepError(RuntimeError):
    """``verify=True`` found a recomputed state that differs from an earlier evaluation."""

"""The closed form t(l, s) = r*l - C(s+r, s+1), written here independently of bincheck's planner:
the counts oracle of the torch and jax front ends' tests (stdlib only)."""

from math import comb


def closed_form(l, s):
    """t(l, s): plain evaluations to reverse l steps with s checkpoints, the initial included."""
    if s >= l:
        return l - 1
    r = 0
    while comb(s + r, s) < l:
        r += 1
    return r * l - comb(s + r, s + 1)

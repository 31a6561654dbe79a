"""Minimal pytrees: nested tuple / list / dict (and namedtuple) containers of array leaves.

The loop is one autograd primitive whose positional arguments are the *leaves* of params, state and
inputs. Passing leaves, not containers, is what lets autograd see a box nested in a user's tuple
(autograd only inspects a primitive's top-level arguments) and avoids its container boxes.
Dict keys are sorted, so two dicts with the same keys have the same structure whatever their order.
``None`` is an empty subtree (no leaves).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A treedef is a hashable nested tuple: LEAF, (NONE,), or (kind, aux, (child treedefs...)).
LEAF = "*"
_NONE = ("None",)


def flatten(tree: Any) -> tuple[list[Any], Any]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(x: Any, leaves: list[Any]) -> Any:
    t = type(x)
    if t is tuple or t is list:
        return (t, None, tuple(_flatten(c, leaves) for c in x))
    if t is dict:
        keys = tuple(sorted(x))
        return (dict, keys, tuple(_flatten(x[k], leaves) for k in keys))
    if x is None:
        return _NONE
    if isinstance(x, tuple) and hasattr(x, "_fields"):     # namedtuple
        return (t, None, tuple(_flatten(c, leaves) for c in x))
    leaves.append(x)
    return LEAF


def unflatten(treedef: Any, leaves: list[Any]) -> Any:
    it = iter(leaves)
    return _build(treedef, it)


def _build(treedef: Any, it) -> Any:
    if treedef is LEAF:
        return next(it)
    if treedef is _NONE or treedef == _NONE:
        return None
    kind, aux, children = treedef
    if kind is dict:
        return {k: _build(c, it) for k, c in zip(aux, children)}
    if kind is tuple or kind is list:
        return kind(_build(c, it) for c in children)
    return kind(*(_build(c, it) for c in children))


def describe(treedef: Any) -> str:
    """A short human spelling of a structure, for error messages."""
    if treedef is LEAF:
        return "leaf"
    if treedef == _NONE:
        return "None"
    kind, aux, children = treedef
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(aux, children)) + "}"
    inner = ", ".join(describe(c) for c in children)
    if kind is list:
        return f"[{inner}]"
    if kind is tuple:
        return f"({inner}{',' if len(children) == 1 else ''})"
    return f"{kind.__name__}({inner})"


def shape_of(leaf: Any) -> tuple[int, ...]:
    return np.shape(leaf)

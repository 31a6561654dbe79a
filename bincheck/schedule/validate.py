"""Argument validators shared by every layer (stdlib only).

Each raises a TypeError (wrong kind of value) or ValueError (right kind, bad value) whose message
names the argument, the value received and the rule, and returns the value normalised to a plain
Python ``int`` / ``bool``, so ``numpy.int64(5)`` and ``numpy.bool_(True)`` work wherever ``5`` and
``True`` do. Bools are not integers here and integers are not bools: ``num_ckpts=True`` or
``verify=1`` is almost always a slip.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

NUM_CKPTS_RULE = " (it counts stored states, the initial one included)"


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters so a huge argument is not echoed in full."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_bool(value: object) -> bool:
    # numpy.bool_ is not a subclass of bool; recognise it by name so this module needs no numpy.
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool") and \
        type(value).__module__ == "numpy"


def check_int(name: str, value: object, minimum: int, rule: str = "") -> int:
    """An integer ``>= minimum`` (numpy integers accepted, bools and floats refused)."""
    kind = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a {kind} int{rule}; got {short_repr(value)} of type "
                        f"{type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be a {kind} int{rule}; got {short_repr(value)}")
    return int(value)


def check_positive_int(name: str, value: object, rule: str = "") -> int:
    """Raise a ValueError/TypeError naming ``name`` unless ``value`` is a positive integer."""
    return check_int(name, value, 1, rule)


def check_bool(name: str, value: object) -> bool:
    """A bool (``numpy.bool_`` accepted); anything else is a TypeError."""
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool (True or False); got {short_repr(value)} of type "
                        f"{type(value).__name__}")
    return bool(value)


def exactly_one_budget(num_ckpts: object, memory: object) -> None:
    """Raise a TypeError unless exactly one of ``num_ckpts`` and ``memory`` is given."""
    if (num_ckpts is None) == (memory is None):
        raise TypeError(f"give exactly one of num_ckpts (checkpoints held at once, the initial "
                        f"state included) and memory (bytes, e.g. memory='200MB'); got "
                        f"num_ckpts={short_repr(num_ckpts)} and memory={short_repr(memory)}")


def check_callable(name: str, value: object, signature: str) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable as {signature}; got {short_repr(value)} of type "
                        f"{type(value).__name__}")


def check_disk(disk: Any, memory: Any) -> Any:
    """None (RAM only), True (a temporary directory) or a directory path; needs ``memory``."""
    if disk is None or disk is False:
        return None
    if disk is not True and not isinstance(disk, (str, os.PathLike)):
        raise TypeError(f"disk must be None, True (a private temporary directory) or a "
                        f"directory path; got {short_repr(disk)} of type {type(disk).__name__}")
    if memory is None:
        raise TypeError("disk=... needs memory=... (the RAM budget; states beyond it go to "
                        "disk)")
    if disk is True:
        return True
    path = os.fspath(disk)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"disk={short_repr(path)}: no such directory (bincheck writes its "
                                f"snapshots into a private subdirectory of an existing one)")
    return path

"""Sizes in bytes: parsing a budget given as a number or a string with a unit, and printing one."""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal
from fractions import Fraction

from .validate import _is_bool, short_repr

_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_bytes(value: object, name: str = "memory") -> int:
    """Bytes from a number or a string with a unit: ``"200MB"``, ``"1.5 GiB"``, ``"64 kB"``.

    Units: B, kB (= KB), MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024).
    Strings and numbers follow the same rules: the size is taken exactly (no float rounding),
    rounded down to whole bytes and must come to at least 1 byte; ``"1.5 B"`` and ``1.5`` are 1
    byte. There is no upper bound: a budget larger than the loop can use simply means that every
    state fits (planning is bounded by the number of steps, not the budget); ``inf`` and
    ``nan`` are not sizes and are refused.
    """
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = match.group(2) if match else None
        if match is None or (unit or "B") not in _UNITS:
            raise ValueError(
                f"{name} must be a number of bytes or a size such as '200MB' or '1.5 GiB' "
                f"(units: {', '.join(_UNITS)}); got {short_repr(value)}")
        number = Fraction(match.group(1)) * _UNITS[unit or "B"]
    elif _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of bytes or a string such as '200MB'; got "
                        f"{short_repr(value)} of type {type(value).__name__}")
    elif isinstance(value, numbers.Integral):
        number = Fraction(int(value))
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number of bytes; got {short_repr(value)}")
        number = Fraction(value)
    if number < 1:
        raise ValueError(f"{name} must be at least 1 byte; got {short_repr(value)}")
    return math.floor(number)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            # Decimal: a budget may exceed what a float holds (parse_bytes has no upper bound)
            return f"{Decimal(n) / size:.3g} {unit}" if n > 2**1000 else f"{n / size:.3g} {unit}"
    return f"{n} B"

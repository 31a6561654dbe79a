"""Report helpers: number formats and the targets table of a markdown report."""

from __future__ import annotations

from typing import Any, Iterable

MiB = 2**20
MARKS = {True: "pass", False: "**miss**", None: "–"}

# (target, problem, passed, numbers); passed None: could not be measured
Target = tuple[str, str, "bool | None", str]


def fmt(v: Any, spec: str, missing: str = "–") -> str:
    return missing if v is None else format(v, spec)


def mib(v: Any, spec: str = ".2f") -> str:
    """Bytes as MiB (``–`` for None)."""
    return fmt(None if v is None else v / MiB, spec)


def cells_of(rows: Iterable, key: str = "cell") -> list[str]:
    """The distinct values of ``key`` over ``rows``, in their first order."""
    return list(dict.fromkeys(getattr(r, key) for r in rows))


def targets_md(targets: Iterable[Target], head: str = "cell") -> str:
    out = [f"| target | {head} | result | numbers |", "|---|---|---|---|"]
    for key, cell, passed, text in targets:
        out.append(f"| {key} | {cell} | {MARKS[passed]} | {text} |")
    return "\n".join(out) + "\n"


def targets_section(targets: Iterable[Target], texts: dict[str, str],
                    head: str = "cell") -> str:
    """The targets table under a bold heading, then what each target asks, one bullet each."""
    return ("\n**Targets**\n\n" + targets_md(targets, head) + "\n"
            + "\n".join(f"- {v}" for v in texts.values()) + "\n")

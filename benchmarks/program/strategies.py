"""The strategies compared on each workload: store-all, torch's checkpointing, torch.compile under
an activation memory budget, bincheck's loop for the RNN, and (:func:`bincheck_strategies`) the
bincheck.torch rows of issue 31.

A strategy's ``gradient()`` runs the forward and the backward into the parameters' ``.grad``
(set to None before, by the harness), the RNG seeded the same before each, so that dropout draws
the same masks in every eager strategy.
"""

from __future__ import annotations

import shutil
import types
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from .models import Workload, sqrt_segments

COMPILE_BUDGETS = (0.5, 0.2, 0.05)


@dataclass
class Strategy:
    name: str                       # row name
    kind: str                       # store-all, per-block, sequential, compile, binomial, bincheck
    label: str                      # short label on the plot
    gradient: Callable[[], None]
    budget: float | None = None     # compile: activation_memory_budget
    memory: int | None = None       # bincheck: memory= bytes
    num_ckpts: int | None = None    # binomial_checkpoint / bincheck num_ckpts=
    budget_of: str | None = None    # what memory= was taken from
    handle: object = None           # a bincheck module or loop: its stats and plan


def store_all(w: Workload) -> Strategy:
    return Strategy("store-all", "store-all", "store-all", lambda: w.loss().backward())


def _ckpt(fn, *args):
    return checkpoint(fn, *args, use_reentrant=False)


def per_block(w: Workload) -> Strategy:
    return Strategy(f"checkpoint per block ({w.blocks} blocks)", "per-block", "per block",
                    lambda: w.loss(_ckpt).backward())


def sequential(w: Workload) -> Strategy | None:
    """``checkpoint_sequential`` with √n segments over the chain of n stages; None where the
    model is no chain."""
    if w.stages is None:
        return None
    n = len(w.stages)
    seg = sqrt_segments(n)

    def gradient():
        out = checkpoint_sequential(w.stages, seg, w.chain_input, use_reentrant=False)
        w.loss_of(out).backward()
    return Strategy(f"checkpoint_sequential, {seg} segments of {n} stages", "sequential",
                    f"seq {seg}", gradient)


def compile_problem() -> str | None:
    """Why inductor cannot compile on this machine, or None when it can (a C++ compiler is what
    it needs on the CPU)."""
    from torch._inductor import cpp_builder
    try:
        cxx = cpp_builder.get_cpp_compiler()
    except Exception as err:            # noqa: BLE001 - any failure is the reason to record
        return f"no C++ compiler for inductor ({type(err).__name__}: {err})"
    if shutil.which(cxx) is None and not shutil.os.path.exists(cxx):
        return f"inductor's C++ compiler {cxx!r} is not on PATH"
    return None


def compiled(w: Workload, budget: float) -> Strategy:
    """torch.compile of the whole loss, partitioned under ``activation_memory_budget=budget``.

    Dynamo keeps compiled code on the function's code object and does not guard on functorch's
    config, so each budget compiles a function with a code object of its own; the budget is set
    around every call (the forward partitions at the first call, the backward compiles at the
    first backward)."""
    import torch._functorch.config as functorch_config

    def loss():
        return w.loss()
    loss = types.FunctionType(loss.__code__.replace(co_name=f"loss_budget_{budget:g}"),
                              loss.__globals__, closure=loss.__closure__)
    fn = torch.compile(loss)

    def gradient():
        with functorch_config.patch(activation_memory_budget=budget):
            fn().backward()
    label = "compile" if budget == 1.0 else f"compile {budget:g}"
    return Strategy(f"torch.compile, activation_memory_budget={budget:g}", "compile", label,
                    gradient, budget=budget)


def binomial(w: Workload, num_ckpts: int) -> Strategy:
    """The RNN only: ``bt.binomial_checkpoint`` over the loop's step (target (c)'s reference)."""
    import bincheck.torch as bt
    cell, xs = w.model, w.inputs[0]
    loop = bt.binomial_checkpoint(lambda c, h, x: c(x, h), len(xs), num_ckpts)

    def gradient():
        w.loss_of(loop(cell, w.chain_input, xs)).backward()
    return Strategy(f"bt.binomial_checkpoint, num_ckpts={num_ckpts}", "binomial",
                    f"binomial s={num_ckpts}", gradient, num_ckpts=num_ckpts, handle=loop)


def peers(w: Workload, compile_budgets=COMPILE_BUDGETS, binomial_ckpts=()) -> list[Strategy]:
    out = [store_all(w), per_block(w), sequential(w)]
    out += [compiled(w, b) for b in compile_budgets]
    if w.name == "rnn":
        out += [binomial(w, s) for s in binomial_ckpts]
    return [s for s in out if s is not None]


# ------------------------------------------------------------------ bincheck (issue 31)

API = ("checkpoint", "checkpoint_module")


def bincheck_missing() -> str | None:
    """What of issue 31's API this checkout lacks (None: all of it is there)."""
    import bincheck.torch as bt
    lacking = [name for name in API if not hasattr(bt, name)]
    return None if not lacking else (
        f"bincheck.torch has no {', '.join(lacking)} in this checkout (issue 31's API has not "
        f"landed)")


def bincheck_strategies(w: Workload, budgets: list[tuple[str, int]]) -> list[Strategy]:
    """bincheck.torch's rows: one ``memory=`` run per ``(label, bytes)`` budget.

    This is where issue 31's API plugs in. A module's forward goes through
    ``bt.checkpoint_module(model, memory=...)`` (its ``.stats`` after the backward); a program that
    is not one module's forward (the RNN's loop) through ``bt.checkpoint(fn, h0, memory=...)``.
    Returns [] while the API is missing (:func:`bincheck_missing`): the report marks those rows
    pending."""
    if bincheck_missing() is not None:
        return []
    import bincheck.torch as bt
    out = []
    for label, memory in budgets:
        if w.apply is not None:
            net = bt.checkpoint_module(w.model, memory=memory)

            def gradient(net=net):
                w.loss_of(w.apply(net)).backward()
        else:
            net = bt.checkpoint_function(w.extra["run"], memory=memory)

            def gradient(net=net):
                w.loss_of(net(w.chain_input)).backward()
        out.append(Strategy(f"bincheck memory= {label}", "bincheck", f"mem={label}", gradient,
                            memory=memory, budget_of=label, handle=net))
    return out


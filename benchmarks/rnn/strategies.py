"""The strategies compared: each builds ``params -> gradient`` for one problem.

* ``store-all``: the plain Python loop under autograd (what users do today).
* ``autograd-checkpoint``: ``autograd.checkpoint`` around every step, autograd's own tool.
* ``sqrt``: one level of sqrt(T) equal segments (like torch's ``checkpoint_sequential``).
* ``bincheck``: ``binomial_checkpoint`` with ``num_ckpts`` states.

Only the public APIs of autograd and bincheck are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import autograd.numpy as np
from autograd import checkpoint as autograd_checkpoint
from autograd import grad
from autograd.builtins import tuple as ag_tuple

from bincheck import CheckpointedLoop, EqualSegments, binomial_checkpoint

from .cells import Cell, final_loss, per_step_loss

STRATEGIES = ("store-all", "autograd-checkpoint", "sqrt", "bincheck")


@dataclass
class Built:
    gradient: Callable[[Any], Any]      # params -> gradient w.r.t. params
    loop: Any = None                    # the CheckpointedLoop, when there is one (stats, plan)
    predicted_plain: int | None = None
    predicted_taped: int | None = None
    slots: int | None = None            # states held by the strategy (None: all)


def _autograd_tuples(fn):
    def wrapped(p, s, x):
        out = fn(p, s, x)
        if isinstance(out, tuple):
            return ag_tuple(ag_tuple(o) if isinstance(o, tuple) else o for o in out)
        return out
    return wrapped


def _plain_loop(step, seq_len, with_outputs):
    def run(params, state, xs):
        ys = []
        for t in range(seq_len):
            out = step(params, state, xs[t])
            if with_outputs:
                state, y = out
                ys.append(y)
            else:
                state = out
        return (state, np.stack(ys)) if with_outputs else state
    return run


def build(strategy: str, cell: Cell, step: Callable, state0, xs, per_step: bool,
          num_ckpts: int | None = None) -> Built:
    """``step`` is the (possibly instrumented) step function to run; ``cell`` names the model."""
    T = xs.shape[0]
    fn = (lambda p, s, x: (lambda new: (new, cell.hidden(new)))(step(p, s, x))) if per_step \
        else step
    if strategy == "store-all":
        run, pred = _plain_loop(fn, T, per_step), Built(None, None, 0, T, T + 1)
    elif strategy == "autograd-checkpoint":
        # defvjp_argnum: one taping per differentiated argument of each step (params and state,
        # except at step 0 where the state is a constant). autograd only sees boxes among a
        # primitive's top-level arguments, so an LSTM's (h, c) is passed as two arguments, and a
        # step returning a plain tuple gets a zero gradient ("Output seems independent of
        # input"), so tuple outputs are rebuilt with autograd.builtins.tuple.
        fn = _autograd_tuples(fn)
        if cell.two_states:
            flat = autograd_checkpoint(lambda p, x, h, c: fn(p, (h, c), x))
            step_ck = lambda p, st, x: flat(p, x, st[0], st[1])
            taped = 3 * T - 2
        else:
            step_ck, taped = autograd_checkpoint(fn), 2 * T - 1
        run, pred = _plain_loop(step_ck, T, per_step), Built(None, None, T, taped, T + 1)
    elif strategy == "sqrt":
        loop = CheckpointedLoop(fn, EqualSegments(T, max(1, round(math.sqrt(T)))), per_step)
        run, pred = loop, Built(None, loop, loop.predicted_plain_steps, T, loop.plan.peak_slots)
    elif strategy == "bincheck":
        loop = binomial_checkpoint(fn, T, num_ckpts, with_outputs=per_step)
        run, pred = loop, Built(None, loop, loop.predicted_plain_steps, T, loop.plan.peak_slots)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")

    if per_step:
        loss = lambda p: per_step_loss(cell, *run(p, state0, xs))
    else:
        loss = lambda p: final_loss(cell, run(p, state0, xs))
    pred.gradient = grad(loss)
    return pred

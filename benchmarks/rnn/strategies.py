"""The strategies compared: each builds ``params -> gradient`` for one problem.

* ``store-all``: the plain Python loop under autograd (what users do today).
* ``autograd-checkpoint``: ``autograd.checkpoint`` around every step, autograd's own tool.
* ``sqrt``: one level of sqrt(T) equal segments (like torch's ``checkpoint_sequential``).
* ``bincheck``: ``binomial_checkpoint`` with ``num_ckpts`` states.
* ``stacked-ys`` (per-step-loss problems only): bincheck with ``with_outputs=True`` emitting the
  hidden state, the loss computed after the loop from the stacked (T, B, H) outputs — the pattern
  the per-step loss in ``output_fn`` replaces, kept as a labelled row to show what it costs.

On a per-step-loss problem every strategy computes the same total loss: the step's loss comes from
the model's ``readout`` (bincheck's ``output_fn``; in the plain loops, called after each step), and
stacked-ys computes the same numbers from the stacked hidden states.

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

from .cells import Cell, CharLM, final_loss

STRATEGIES = ("store-all", "autograd-checkpoint", "sqrt", "bincheck", "stacked-ys")


@dataclass
class Built:
    gradient: Callable[[Any], Any]      # params -> gradient w.r.t. params
    loop: Any = None                    # the CheckpointedLoop, when there is one (stats, plan)
    predicted_plain: int | None = None  # evaluations of the step fn
    predicted_taped: int | None = None
    predicted_out_plain: int | None = None  # evaluations of the per-step readout (output_fn)
    predicted_out_taped: int | None = None


def _autograd_tuples(fn):
    def wrapped(p, s, x):
        out = fn(p, s, x)
        if isinstance(out, tuple):
            return ag_tuple(ag_tuple(o) if isinstance(o, tuple) else o for o in out)
        return out
    return wrapped


def slice_inputs(inputs, t):
    """Step t's inputs: the t-th slice of the array, or of each array in the dict."""
    if isinstance(inputs, dict):
        return {k: v[t] for k, v in inputs.items()}
    return inputs[t]


def _plain_loop(step, readout, seq_len):
    """The loop as users write it; with a readout, ``(final_state, stacked per-step losses)``."""
    def run(params, state, inputs):
        ys = []
        for t in range(seq_len):
            x = slice_inputs(inputs, t)
            state = step(params, state, x)
            if readout is not None:
                ys.append(readout(params, state, x))
        return state if readout is None else (state, np.stack(ys))
    return run


def build(strategy: str, model: Cell | CharLM, state0, inputs, seq_len: int,
          step: Callable | None = None, readout: Callable | None = None,
          num_ckpts: int | None = None) -> Built:
    """The gradient of ``strategy`` on ``model``'s problem.

    ``step`` and ``readout`` are the (possibly instrumented) step and per-step loss to run; by
    default the model's own. A ``Cell`` is the final-state-loss problem; a ``CharLM`` the
    per-step-loss problem (``readout`` is its per-step loss).
    """
    T = seq_len
    per_step = isinstance(model, CharLM)
    cell = model.cell if per_step else model
    step = step or (model.step if per_step else model.fn)
    readout = (readout or model.readout) if per_step else None
    out_taped = T if per_step else None            # plain loops tape every readout once
    if strategy == "store-all":
        run = _plain_loop(step, readout, T)
        built = Built(None, None, 0, T, 0 if per_step else None, out_taped)
    elif strategy == "autograd-checkpoint":
        # defvjp_argnum: one taping per differentiated argument of each step (params and state,
        # except at step 0 where the state is a constant). autograd only sees boxes among a
        # primitive's top-level arguments, so an LSTM's (h, c) is passed as two arguments, and a
        # step returning a plain tuple gets a zero gradient ("Output seems independent of
        # input"), so tuple outputs are rebuilt with autograd.builtins.tuple. The per-step loss
        # stays outside the checkpoint, taped once per step as in store-all.
        fn = _autograd_tuples(step)
        if cell.two_states:
            flat = autograd_checkpoint(lambda p, x, h, c: fn(p, (h, c), x))
            step_ck = lambda p, st, x: flat(p, x, st[0], st[1])
            taped = 3 * T - 2
        else:
            step_ck, taped = autograd_checkpoint(fn), 2 * T - 1
        run = _plain_loop(step_ck, readout, T)
        built = Built(None, None, T, taped, 0 if per_step else None, out_taped)
    elif strategy in ("sqrt", "bincheck"):
        schedule = (EqualSegments(T, max(1, round(math.sqrt(T)))) if strategy == "sqrt"
                    else None)
        loop = (CheckpointedLoop(step, schedule, output_fn=readout) if schedule is not None
                else binomial_checkpoint(step, T, num_ckpts, output_fn=readout))
        # output_fn runs once plain per step in the forward and once taped per step.
        run = loop
        built = Built(None, loop, loop.predicted_plain_steps, T, T if per_step else None,
                      out_taped)
    elif strategy == "stacked-ys":
        if not per_step:
            raise ValueError("stacked-ys needs a per-step-loss problem (char-lm)")

        def stacked(p, s, x):                      # y = the new hidden state
            new = step(p, s, x)
            return new, cell.hidden(new)
        loop = binomial_checkpoint(stacked, T, num_ckpts, with_outputs=True)
        built = Built(None, loop, loop.predicted_plain_steps, T, None, None)
        built.gradient = grad(
            lambda p: model.stacked_loss(p, loop(p, state0, inputs)[1], inputs["targets"]))
        return built
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")

    if per_step:
        built.gradient = grad(lambda p: model.loss(run(p, state0, inputs)[1]))
    else:
        built.gradient = grad(lambda p: final_loss(cell, run(p, state0, inputs)))
    return built

"""The two autograd primitives and every derivative rule registered for them.

* ``loop_primitive(*leaves, call=...)``: the whole loop, its positional arguments the leaves of
  ``(params, init_state, inputs)`` (see :mod:`.boundary`). Its forward runs the schedule's first
  sweep on plain arrays, keeping the snapshots the schedule asks for.
* ``vjp_primitive(*leaves, *g, call=...)``: the reverse sweep V(z, g) = J(z)^T g as a primitive of
  its own, so an outer trace (grad of grad, jvp of grad) differentiates it with the tangent-loop
  rules of :mod:`.tangent` instead of taping every step of it.

Measured pitfalls this is shaped around: autograd calls a VJP *maker* while it builds the node in
the forward pass, so the maker only captures references and all work happens in the returned
closure; and ``defvjp_argnums`` (not ``defvjp_argnum``) gets all requested cotangents from one sweep.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from autograd.core import defjvp_argnums, defvjp_argnums
from autograd.tracer import primitive

from .boundary import Call
from .sweep import reverse_sweep
from .tangent import VJPCall, tangent


def _loop_forward(*args: Any, call: Call) -> tuple:
    t0 = time.perf_counter()
    out = call.pack(call.loop.forward(call, args))
    call.pending.stats.library_seconds += time.perf_counter() - t0
    return out


def _vjp_forward(*args2: Any, call: VJPCall) -> tuple:
    n = call.n_args
    return reverse_sweep(call.call, call.argnums, args2[:n], args2[n:])


def _make_vjp(argnums: tuple, ans: Any, args: tuple, kwargs: dict) -> Callable:
    vcall = VJPCall(kwargs["call"], argnums, len(args))
    return lambda g: vjp_primitive(*args, *g, call=vcall)


loop_primitive = primitive(_loop_forward)
vjp_primitive = primitive(_vjp_forward)

defvjp_argnums(loop_primitive, _make_vjp)
defjvp_argnums(loop_primitive,
               lambda argnums, gs, ans, args, kwargs: tangent(kwargs["call"], argnums, gs, args))
defvjp_argnums(vjp_primitive,
               lambda argnums, ans, args, kwargs: kwargs["call"].vjp_of_vjp(argnums, args))
defjvp_argnums(vjp_primitive,
               lambda argnums, gs, ans, args, kwargs: kwargs["call"].jvp_of_vjp(argnums, gs, args))

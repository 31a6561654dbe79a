"""The JAX front end: the only package of bincheck that imports jax.

One concept per module, the same roles as :mod:`bincheck.torch` (imports flow one way:
``loops``/``while_loop`` -> ``sweep``/``revolve`` -> ``boundary``; ``tables`` and ``sizes``
beside them):

* :mod:`.boundary`   pytrees <-> flat leaves, shape checks at trace time, closures hoisted
* :mod:`.tables`     a plan compiled into int32 tables (numpy; the planner is the only source)
* :mod:`.sweep`      the checkpointed sweeps replaying the tables under ``jit`` (and a
                     ``custom_vjp`` of them)
* :mod:`.forward`    the loop as one hijax primitive: the sweeps plus a tangent loop (forward mode)
* :mod:`.first_order` a backward sweep as a primitive with forward mode only (grad of grad: a
                     clear error)
* :mod:`.sizes`      state and working-set bytes from shapes, for ``memory=``
* :mod:`.loops`      :func:`binomial_checkpoint`, the ``lax.scan`` drop-in :func:`scan` and
                     :func:`scan_plan` (the plan a gradient of it uses)
* :mod:`.revolve`    Revolve in the traced program, for segments whose length is known at run time
* :mod:`.while_loop` :func:`while_loop` (the ``lax.while_loop`` drop-in), online planner tables
"""

from .first_order import SecondOrderError
from .forward import RematWarning
from .loops import CheckpointedLoop, binomial_checkpoint, scan, scan_plan
from .while_loop import while_loop

__all__ = ["binomial_checkpoint", "scan", "scan_plan", "while_loop", "CheckpointedLoop",
           "RematWarning", "SecondOrderError"]

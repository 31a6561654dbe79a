"""The autograd adapter: the only package that imports HIPS autograd.

One concept per module, imports flowing one way (``loops`` -> ``primitives`` -> ``tangent``,
``sweep`` -> ``tape`` -> ``steps`` -> ``verify``, all over ``boundary``):

* :mod:`.boundary`   user trees <-> the primitive's arguments; the per-call context
* :mod:`.steps`      the checked plain step (read-only views, structure checks, outputs)
* :mod:`.tape`       taping one segment and its multi-output backward
* :mod:`.sweep`      the reverse sweep (adjoint, accumulators, one sweep for all arguments)
* :mod:`.verify`     ``verify=True``: an executor observer comparing recomputations
* :mod:`.tangent`    the tangent loop: forward mode and higher-order rules
* :mod:`.primitives` the two primitives and all their ``def*vjp/jvp`` registrations
* :mod:`.loops`      the schedule-driven front end, ``binomial_checkpoint``
* :mod:`.while_loop` the front end for loops of unknown length, ``checkpointed_while_loop``
* :mod:`.budgets`    byte budgets: a step measured once (:mod:`.probe`), a plan per call
* :mod:`.trace`      recording any program's primitive ops compactly; live sets
* :mod:`.replay`     replaying a recorded trace: plain advances, taped segments pulled back
* :mod:`.program`    ``checkpoint_program``: a recorded program planned and replayed
"""

from .boundary import InternalError
from .loops import CheckpointedLoop, binomial_checkpoint
from .program import CheckpointedProgram, checkpoint_program
from .while_loop import WhileLoop, checkpointed_while_loop
from .verify import NondeterministicStepError

__all__ = ["CheckpointedLoop", "WhileLoop", "binomial_checkpoint", "checkpointed_while_loop",
           "NondeterministicStepError", "InternalError", "checkpoint_program",
           "CheckpointedProgram"]

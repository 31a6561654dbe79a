"""The PyTorch front end: the only package of bincheck that imports torch.

One concept per module, the same roles as :mod:`bincheck.autograd` (imports flow one way:
``loops``/``while_loop`` -> ``function`` -> ``sweep`` -> ``steps`` -> ``boundary``; ``store``,
``context``, ``probe`` beside them):

* :mod:`.boundary`   user arguments (tensors, trees, an ``nn.Module``) <-> the Function's leaves;
                     parameter aliases
* :mod:`.context`    autocast and RNG captured at the forward, re-entered in the backward
* :mod:`.store`      snapshots by reference with a version guard and their RNG state; disk codec
* :mod:`.steps`      checked plain steps, taped segments, per-step outputs, ``verify``
* :mod:`.sweep`      the reverse sweep: one pullback per taped segment, cotangents once
* :mod:`.function`   the ``torch.autograd.Function`` (retain_graph and create_graph included)
* :mod:`.probe`      sizes and times of one step, for byte budgets
* :mod:`.loops`      :func:`binomial_checkpoint`
* :mod:`.while_loop` :func:`checkpointed_while_loop`
* :mod:`.trace`      any forward recorded as aten ops (values, externals, live sets, writes)
* :mod:`.recorder`   the dispatch mode and saved-tensor hook that record a forward
* :mod:`.ops`        what an aten op writes, draws and gives (for the recorder and replays)
* :mod:`.replay`     the recorded ops replayed plain or taped: the stepper of a program's backward
* :mod:`.program`    one gradient of a recorded forward: plan, and a backward that drives it
* :mod:`.networks`   :func:`checkpoint`, :func:`checkpoint_module`, :func:`checkpoint_sequential`
"""

from ..runtime.errors import NondeterministicStepError
from .loops import CheckpointedLoop, binomial_checkpoint
from .networks import (CheckpointedModule, checkpoint, checkpoint_function, checkpoint_module,
                       checkpoint_sequential)
from .program import CheckpointedFunction, ProgramPlan, last_stats
from .while_loop import WhileLoop, checkpointed_while_loop

__all__ = ["binomial_checkpoint", "checkpointed_while_loop", "CheckpointedLoop", "WhileLoop",
           "NondeterministicStepError", "checkpoint", "checkpoint_function", "checkpoint_module",
           "checkpoint_sequential", "last_stats", "CheckpointedFunction", "CheckpointedModule",
           "ProgramPlan"]

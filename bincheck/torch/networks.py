"""The entry points for any PyTorch forward: :func:`checkpoint` (a drop-in for
``torch.utils.checkpoint.checkpoint``), :func:`checkpoint_module` (an ``nn.Module`` sharing the
model's parameters and state), :func:`checkpoint_sequential` (torch's, with a budget in place
of ``segments``) and :func:`checkpoint_function`; each builds a
:class:`~.program.CheckpointedFunction` (how one gradient runs: :mod:`.program`)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

from torch import nn

from ..runtime.stats import ProgramStats
from ..schedule.budget import parse_bytes
from ..schedule.validate import (NUM_CKPTS_RULE, check_bool, check_callable,
                                 check_positive_int, exactly_one_budget)
from .program import CheckpointedFunction, ProgramPlan


def _configure(fn: Callable, num_ckpts: Any, memory: Any, verify: Any,
               preserve_rng_state: Any) -> CheckpointedFunction:
    exactly_one_budget(num_ckpts, memory)
    if memory is not None:
        memory = parse_bytes(memory)
    else:
        num_ckpts = check_positive_int("num_ckpts", num_ckpts, NUM_CKPTS_RULE)
    return CheckpointedFunction(fn, num_ckpts, memory, check_bool("verify", verify),
                                check_bool("preserve_rng_state", preserve_rng_state))


def checkpoint_function(fn: Callable, num_ckpts: int | None = None, *,
                        memory: int | str | None = None, verify: bool = False,
                        preserve_rng_state: bool = True) -> CheckpointedFunction:
    """``f = checkpoint_function(fn, memory="200MB")``: ``f(*args, **kwargs)`` is
    ``fn(*args, **kwargs)``, its gradient planned over the whole forward; ``f.stats`` describes
    the last backward and ``f.preview(*args)`` the plan. Plans are reused across calls with the
    same op sequence and shapes."""
    check_callable("fn", fn, "fn(*args, **kwargs) -> tensors")
    return _configure(fn, num_ckpts, memory, verify, preserve_rng_state)


# the plans of bt.checkpoint's functions, kept while the function (or a bound method's object)
# lives: a training loop calling bt.checkpoint(block, x, ...) each step reuses the plan
_cache: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _cached(function: Callable, f: CheckpointedFunction) -> CheckpointedFunction:
    """``f`` with the plan book of ``function`` (the same configuration's), kept weakly."""
    owner, key = getattr(function, "__self__", None), getattr(function, "__func__", None)
    if owner is None or key is None:
        owner, key = function, None
    config = (key, f.num_ckpts, f.memory, f.verify, f.preserve_rng_state)
    try:
        with _cache_lock:
            book = _cache.setdefault(owner, {}).setdefault(config, f.book)
    except TypeError:                        # not weakly referable: no plan reuse
        return f
    return CheckpointedFunction(function, f.num_ckpts, f.memory, f.verify,
                                f.preserve_rng_state, book)


def checkpoint(function: Callable, *args: Any, num_ckpts: int | None = None,
               memory: int | str | None = None, verify: bool = False,
               preserve_rng_state: bool = True, use_reentrant: bool | None = None,
               **kwargs: Any) -> Any:
    """A drop-in for ``torch.utils.checkpoint.checkpoint(function, *args,
    use_reentrant=False, **kwargs)``, planned over the whole forward of ``function`` within
    ``num_ckpts`` snapshots or ``memory`` bytes (exactly one), with as many recomputations as
    pay. Other keyword arguments go to ``function``. The stats of the last backward in this
    thread: :func:`last_stats`."""
    check_callable("function", function, "function(*args, **kwargs) -> tensors")
    if use_reentrant:
        raise ValueError("bincheck.torch.checkpoint has no reentrant variant: pass "
                         "use_reentrant=False or leave it out")
    f = _cached(function, _configure(function, num_ckpts, memory, verify, preserve_rng_state))
    return f(*args, **kwargs)


class CheckpointedModule(nn.Module):
    """``net(x) == model(x)``, its backward planned by bincheck; see
    :func:`checkpoint_module`. Shares the model's parameters, buffers and submodules (the same
    objects, the same ``state_dict`` keys)."""

    def __init__(self, model: nn.Module, program: CheckpointedFunction) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "program", program)
        # the model's own dicts, shared: parameters(), state_dict(), to(), load_state_dict()
        # act on the model's tensors under the model's names
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        self._non_persistent_buffers_set = model._non_persistent_buffers_set

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)

    @property
    def training(self) -> bool:
        """The model's mode (``model.eval()`` called directly shows here too)."""
        model = self.__dict__.get("model")
        return model.training if model is not None else self.__dict__.get("_mode", True)

    @training.setter
    def training(self, mode: bool) -> None:
        model = self.__dict__.get("model")
        if model is None:                   # nn.Module.__init__, before the model is set
            self.__dict__["_mode"] = mode
        else:
            model.training = mode

    def train(self, mode: bool = True) -> "CheckpointedModule":
        self.model.train(mode)
        return self

    @property
    def stats(self) -> ProgramStats:
        """The :class:`~bincheck.ProgramStats` of the last call (its forward; its backward as
        it runs): ``plan_seconds`` is 0 where the call reused a plan."""
        return self.program.stats

    @property
    def last_plan(self) -> ProgramPlan | None:
        """The plan of the last call (``plan_seconds``: how long making it took)."""
        return self.program.last_plan

    def preview(self, *args: Any, **kwargs: Any) -> ProgramPlan:
        return self.program.preview(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CheckpointedModule({self.model!r})"


def checkpoint_module(model: nn.Module, num_ckpts: int | None = None, *,
                      memory: int | str | None = None, verify: bool = False,
                      preserve_rng_state: bool = True) -> CheckpointedModule:
    """``net = checkpoint_module(model, memory="200MB")``: a module whose forward is
    ``model``'s and whose backward holds at most ``num_ckpts`` snapshots or ``memory`` bytes.
    ``net.parameters()`` are ``model``'s, ``net.state_dict()`` has ``model``'s keys,
    ``net.train()``/``net.eval()`` reach ``model``; ``net.stats`` describes the last backward,
    ``net.preview(x)`` the plan for ``x``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    program = _configure(model, num_ckpts, memory, verify, preserve_rng_state)
    return CheckpointedModule(model, program)


def checkpoint_sequential(functions: Iterable[Callable] | nn.Sequential, input: Any,
                          num_ckpts: int | None = None, *, memory: int | str | None = None,
                          verify: bool = False, preserve_rng_state: bool = True) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input)`` with
    ``segments`` replaced by a budget: ``functions`` run in order on ``input``, planned over
    their ops' measured costs and sizes."""
    fs = list(functions.children()) if isinstance(functions, nn.Sequential) else \
        list(functions)
    for i, f in enumerate(fs):
        check_callable(f"functions[{i}]", f, "f(x) -> x")

    def run(x: Any) -> Any:
        for f in fs:
            x = f(x)
        return x
    run.__name__ = "sequential"
    f = _configure(run, num_ckpts, memory, verify, preserve_rng_state)
    if isinstance(functions, nn.Module):     # an nn.Sequential: its plans are reused
        book = _cached(functions, _configure(functions, num_ckpts, memory, verify,
                                             preserve_rng_state)).book
        f = CheckpointedFunction(run, f.num_ckpts, f.memory, f.verify, f.preserve_rng_state,
                                 book)
    return f(input)

"""User arguments <-> the leaves of one ``torch.autograd.Function`` call.

Every tensor the loop reads is an explicit input of the Function: the leaves of ``params`` (or
an ``nn.Module``'s parameters), of ``init_state`` and of ``inputs``. That is what lets
``.backward()``, ``torch.autograd.grad(loss, anything)``, tensor hooks, optimizers and DDP see
exactly one gradient per parameter (the reentrant checkpoint's habit of reaching closed-over
parameters by side effect gives a silently wrong ``autograd.grad`` and fires hooks per segment).
Inside the Function, taped steps run on *aliases*: detached tensors sharing the parameters'
storage, made once per call; their accumulated ``.grad`` is returned as the parameters' gradient.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch import nn

from ..schedule.validate import short_repr
from ..tree import LEAF, flatten, unflatten


class InternalError(AssertionError):
    """A bincheck invariant failed (a bug in bincheck, never in the user's code)."""


def differentiable(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())


# Swapping a module's parameters is visible to every thread using the module: taped segments of
# concurrent calls take turns, and a call reads a module's parameters only between them
# (reentrant: a loop may call itself from inside its own step). Plain steps of other calls may
# run on the aliases meanwhile: the same storage, and no graph is built there.
_SWAP = threading.RLock()


def parameter_slots(module: nn.Module) -> tuple[list, list]:
    """A module's distinct parameters, and every place each one is registered: (submodule,
    attribute name, index of the parameter) — a tied weight has several places, one leaf."""
    index: dict[int, int] = {}
    params, slots = [], []
    for name, p in module.named_parameters(remove_duplicate=False):
        k = index.setdefault(id(p), len(params))
        if k == len(params):
            params.append(p)
        owner, _, attr = name.rpartition(".")
        slots.append((module.get_submodule(owner), attr, k))
    return params, slots


class Args:
    """One call's arguments flattened: ``p`` (params), ``s`` (state) and ``x`` (inputs) leaves."""

    __slots__ = ("module", "slots", "p_def", "s_def", "x_def", "p", "s", "x", "seq_len",
                 "given")

    def __init__(self, params: Any, init_state: Any, inputs: Any, seq_len: int | None) -> None:
        if isinstance(params, nn.Module):
            self.module = params
            with _SWAP:                        # never read another call's aliases
                self.p, self.slots = parameter_slots(params)
            self.p_def = None
        else:
            self.module, self.slots = None, None
            self.p, self.p_def = flatten(params)
        self.given = params                   # what plain steps receive, built once
        self.s, self.s_def = flatten(init_state)
        self.x, self.x_def = flatten(inputs)
        self.seq_len = seq_len
        check_state(self.s)
        if seq_len is not None:
            check_inputs(self.x, inputs, seq_len)

    @property
    def leaves(self) -> list:
        return self.p + self.s + self.x

    def split(self, leaves: tuple) -> tuple[list, list, list]:
        a, b = len(self.p), len(self.p) + len(self.s)
        if len(leaves) != b + len(self.x):
            raise InternalError(f"{len(leaves)} leaves for {b + len(self.x)} arguments")
        return list(leaves[:a]), list(leaves[a:b]), list(leaves[b:])

    def params(self, leaves: list | None = None) -> Any:
        """The params object ``fn`` receives: the module itself, or the tree of ``leaves``."""
        if self.module is not None:
            return self.module
        return unflatten(self.p_def, self.p if leaves is None else leaves)

    def call_with(self, aliases: list | None, body: Callable, *args: Any) -> Any:
        """``body(params, *args)`` with the parameters replaced by ``aliases`` (None: as given).

        A module's parameters are substituted in its (and its submodules') parameter dicts for
        the duration of the call and put back after it, whatever happens: what
        ``torch.func.functional_call`` does, at the cost of a few dict writes (functional_call's
        own bookkeeping, paid once per taped segment, cost as much as a taped step)."""
        if aliases is None:
            return body(self.given, *args)
        if self.module is None:
            return body(unflatten(self.p_def, aliases), *args)
        saved = []
        with _SWAP:
            try:
                for owner, attr, k in self.slots:
                    saved.append((owner, attr, owner._parameters[attr]))
                    owner._parameters[attr] = aliases[k]
                return body(self.module, *args)
            finally:
                for owner, attr, p in saved:
                    owner._parameters[attr] = p

    def x_at(self, t: int, leaves: list | None = None) -> Any:
        leaves = self.x if leaves is None else leaves
        if self.x_def is LEAF:
            return leaves[0][t]
        return unflatten(self.x_def, [leaf[t] for leaf in leaves])

    def state(self, leaves: list) -> Any:
        return unflatten(self.s_def, leaves)


def aliases(leaves: list, wanted: list[bool]) -> list:
    """Detached stand-ins for the parameters inside the Function: the same storage, and
    ``requires_grad`` where a gradient is wanted (their ``.grad`` accumulates over the sweep)."""
    out = []
    for v, want in zip(leaves, wanted):
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if want:
                v.requires_grad_()
        out.append(v)
    return out


def check_state(leaves: list) -> None:
    for k, v in enumerate(leaves):
        if not isinstance(v, torch.Tensor):
            which = "" if len(leaves) == 1 else f" (leaf {k} of {len(leaves)})"
            raise TypeError(f"init_state must be a tensor or a tuple/list/dict of tensors; got "
                            f"{short_repr(v)} of type {type(v).__name__}{which}")


def check_inputs(leaves: list, inputs: Any, seq_len: int) -> None:
    for k, v in enumerate(leaves):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"inputs must be None, a tensor or a tuple/list/dict of tensors with "
                            f"leading length seq_len={seq_len}; got {short_repr(v)} of type "
                            f"{type(v).__name__}")
        if v.dim() == 0 or v.shape[0] != seq_len:
            got = "a 0-d tensor" if v.dim() == 0 else f"leading length {v.shape[0]}"
            which = "" if len(leaves) == 1 else f" (leaf {k} of {len(leaves)})"
            hint = ""
            if type(inputs) in (list, tuple) and len(inputs) == seq_len:
                hint = (f". inputs is a {type(inputs).__name__} of {seq_len} items: if they are "
                        f"the per-step inputs, pass torch.stack(inputs)")
            raise ValueError(f"inputs must have leading length seq_len={seq_len} (step t "
                             f"receives inputs[t]); got {got}{which} (shape "
                             f"{tuple(v.shape)}){hint}")

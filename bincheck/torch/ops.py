"""What an aten op does beside computing its results, as the recorder (:mod:`.trace`) and the
replays (:mod:`.replay`) need to know it: which of its tensor arguments it writes into
(declared by its schema, or BatchNorm's running statistics, which the schema of
``native_batch_norm`` does not declare), the generator state a random op draws from, and a
fingerprint of a result for ``verify=True``."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

# ops whose schema does not declare the running statistics they write (positions 3 and 4,
# written when ``training``, argument 5, is true)
_BATCH_NORMS = {"native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm"}


def rng_state(device: torch.device) -> Any:
    if device.type == "cuda":
        return ("cuda", device.index or 0, torch.cuda.get_rng_state(device))
    return ("cpu", None, torch.get_rng_state())


def set_rng_state(state: Any) -> None:
    kind, index, value = state
    if kind == "cuda":
        torch.cuda.set_rng_state(value, index)
    else:
        torch.set_rng_state(value)


class no_dispatch:
    """Python dispatch (modes, tensor subclasses) off: the recorder's own work."""

    def __enter__(self):
        self.guard = torch._C._DisableTorchDispatch()
        self.guard.__enter__()

    def __exit__(self, *exc):
        self.guard.__exit__(*exc)


def written_positions(func, args: tuple, kwargs: dict) -> list[int]:
    """Positions in the flattened ``(args, kwargs)`` of the tensor arguments ``func`` writes
    into."""
    schema = func._schema
    names = []
    if schema.is_mutable:
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                names.append(i)
    elif func._opname in _BATCH_NORMS and len(args) > 5 and args[5]:
        names = [3, 4]
    if not names:
        return []
    # positions of the flattened (args, kwargs): positional arguments first, in order; each
    # tensor argument is one leaf, a list of tensors several
    positions = []
    pos = 0
    for i, a in enumerate(args):
        leaves = tree_flatten(a)[0]
        if i in names:
            positions += [pos + j for j, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        pos += len(leaves)
    arg_names = [a.name for a in schema.arguments]
    if kwargs and any(arg_names[i] in kwargs for i in names if i < len(arg_names)):
        base = pos                              # kwargs flatten in their order
        for key in kwargs:
            leaves = tree_flatten(kwargs[key])[0]
            if key in arg_names and arg_names.index(key) in names:
                positions += [base + j for j, x in enumerate(leaves)
                              if isinstance(x, torch.Tensor)]
            base += len(leaves)
    return positions


def fingerprint(t: torch.Tensor) -> tuple:
    """A tensor's shape, sum and last element (``verify=True`` compares replays with it)."""
    with torch.no_grad(), no_dispatch():
        if t.numel() == 0:
            return (tuple(t.shape),)
        flat = t.detach().reshape(-1)
        wide = torch.complex128 if t.dtype.is_complex else \
            torch.float64 if t.dtype.is_floating_point else torch.int64
        flat = flat.to(wide)
        return (tuple(t.shape), complex(flat.sum().item()), complex(flat[-1].item()))

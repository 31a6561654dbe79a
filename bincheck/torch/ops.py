"""What an aten op does beside computing its results, as the recorder (:mod:`.trace`) and the
replays (:mod:`.replay`) need to know it: which of its tensor arguments it writes into
(declared by its schema, or BatchNorm's running statistics, which the schema of
``native_batch_norm`` does not declare), how its arguments flatten, the generator state a random op draws from, and a
fingerprint of a result for ``verify=True``."""

from __future__ import annotations

from typing import Any

import torch

# ops whose schema does not declare the running statistics they write (positions 3 and 4,
# written when ``training``, argument 5, is true)
_BATCH_NORMS = {"native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm"}
# ops whose results depend on grad mode: the fused RNNs return their backward's workspace only
# with it on (``mkldnn_rnn_layer``: an LSTM in float32 on the CPU); replays run them in the mode
# they ran in
GRAD_MODE_OPS = {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward", "_cudnn_rnn", "miopen_rnn"}


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


def flatten_args(args: tuple, kwargs: dict) -> tuple[list, tuple]:
    """An aten op's ``(args, kwargs)`` as a flat list and a spec to rebuild them: an aten
    argument is a leaf or a list/tuple of leaves (``cat``'s tensors, ``index``'s indices), never
    deeper. (torch's pytree does this generally, at several times the cost per op.)"""
    flat: list = []
    spec: list = []
    keys = tuple(kwargs) if kwargs else ()
    for a in (args + tuple(kwargs.values())) if kwargs else args:
        t = type(a)
        if t is list or t is tuple:
            spec.append((t, len(a)))
            flat.extend(a)
        else:
            spec.append(None)
            flat.append(a)
    return flat, (len(args), keys, tuple(spec))


def unflatten_args(flat: list, spec: tuple) -> tuple[list, dict]:
    n_args, keys, specs = spec
    values, i = [], 0
    for s in specs:
        if s is None:
            values.append(flat[i])
            i += 1
        else:
            kind, n = s
            values.append(kind(flat[i:i + n]))
            i += n
    return values[:n_args], dict(zip(keys, values[n_args:]))


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors an op returned, in order (a tensor, or a tuple/list holding tensors and
    lists of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) is tuple or type(out) is list:
        found: list = []
        for o in out:
            if isinstance(o, torch.Tensor):
                found.append(o)
            elif type(o) is tuple or type(o) is list:
                found += tensors_of(o)
        return found
    return []


_FACTS: dict[int, tuple] = {}


def op_facts(func) -> tuple:
    """What the recorder asks of an aten op on every call, worked out once per op: ``(func,
    does it draw random numbers, the schema indices of the arguments it writes into, is it a
    BatchNorm, its arguments' names, do its results depend on grad mode)``. By ``id``: an
    ``OpOverload`` lives as long as torch."""
    facts = _FACTS.get(id(func))
    if facts is None or facts[0] is not func:
        schema = func._schema
        written = tuple(i for i, a in enumerate(schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write) \
            if schema.is_mutable else ()
        facts = _FACTS[id(func)] = (func, torch.Tag.nondeterministic_seeded in func.tags,
                                    written, func._opname in _BATCH_NORMS,
                                    [a.name for a in schema.arguments],
                                    func._opname in GRAD_MODE_OPS)
    return facts


def written_positions(func, flat: list, spec: tuple) -> list[int]:
    """Positions in the flattened arguments (:func:`flatten_args`) of the tensors ``func``
    writes into: those its schema marks as written, or BatchNorm's running statistics."""
    _, _, written, batch_norm, names, _ = op_facts(func)
    if not written:
        if not (batch_norm and spec[0] > 5 and flat[5]):
            return []
        written = (3, 4)                        # running_mean, running_var, when training
    n_args, keys, specs = spec
    # the schema index of each flattened argument (positional first, then by keyword)
    which = list(range(n_args)) + [names.index(k) if k in names else -1 for k in keys]
    positions, pos = [], 0
    for index, s in zip(which, specs):
        width = 1 if s is None else s[1]
        if index in written:
            positions += [p for p in range(pos, pos + width)
                          if isinstance(flat[p], torch.Tensor)]
        pos += width
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


def refuse_unrecordable(t: torch.Tensor) -> None:
    """A tensor a replay cannot stand in for: sparse (no storage), or a ``torch.func``
    transform's (``vmap``, ``jvp``: its batch or tangent is the transform's)."""
    what = None
    if t.layout is not torch.strided:
        what = f"a {t.layout} tensor (only strided tensors are recorded)"
    elif torch._C._functorch.is_functorch_wrapped_tensor(t):
        what = "a tensor of a torch.func transform (vmap, jvp, grad)"
    if what is not None:
        raise NotImplementedError(
            f"bincheck.torch: the checkpointed function reads {what}; bincheck.torch checkpoints "
            f"reverse-mode autograd of dense tensors: call the function plainly there")

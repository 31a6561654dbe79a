"""The ambient state a step runs in, captured at the forward and re-entered for every replay.

The reverse sweep runs inside torch's backward, outside the user's ``autocast`` region (and, for
CUDA, on the autograd engine's device thread, where autocast state is thread-local): recomputed
and taped steps must run in the autocast state of the forward, as ``torch.utils.checkpoint``
re-enters it. The caller's RNG stream must come out of the backward as it went in, whatever the
replays draw (``fork_rng``); the snapshots themselves restore the loop's RNG state
(:class:`~.store.TorchStore`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

_DEVICE_TYPES = ("cpu", "cuda")


class Ambient:
    """Autocast settings (per device type) and the CUDA devices of one call, from its forward."""

    __slots__ = ("autocast", "cache", "devices", "rng")

    def __init__(self, leaves: list, preserve_rng_state: bool) -> None:
        self.autocast = [(d, torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES
                         if _available(d) and torch.is_autocast_enabled(d)]
        self.cache = torch.is_autocast_cache_enabled()
        self.devices = rng_devices(leaves)
        self.rng = preserve_rng_state

    @contextlib.contextmanager
    def reentered(self) -> Iterator[None]:
        """Autocast as in the forward, and the caller's RNG streams untouched on exit."""
        with contextlib.ExitStack() as stack:
            if self.rng:
                stack.enter_context(torch.random.fork_rng(devices=self.devices))
            for device, dtype in self.autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype,
                                                   cache_enabled=self.cache))
            yield


def _available(device_type: str) -> bool:
    return device_type == "cpu" or torch.cuda.is_available()


def rng_devices(leaves: list[Any]) -> list[int]:
    return sorted({v.device.index or 0 for v in leaves
                   if isinstance(v, torch.Tensor) and v.device.type == "cuda"})

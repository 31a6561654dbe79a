"""The problem (one RNN cell, T steps, loss = sum(h_T ** 2)) and the strategies compared.

Every strategy is a ``gradient()`` that runs the forward and ``.backward()`` once, leaving the
gradient in the cell's ``.grad`` (the harness sets them to None before each call). ``.backward()``
is used everywhere because reentrant ``checkpoint_sequential`` gives a wrong gradient with
``torch.autograd.grad`` on parameters it closes over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import bincheck.torch as bt

CELLS = {"tanh": nn.RNNCell, "lstm": nn.LSTMCell, "gru": nn.GRUCell}
PEERS = ("per-step", "seq-reentrant", "seq-nonreentrant", "nested")


@dataclass
class Problem:
    cell_name: str
    seq_len: int
    hidden: int
    batch: int
    input_size: int
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        """The same numbers on every device: drawn on the CPU, then moved."""
        g = torch.Generator().manual_seed(self.seed)
        torch.manual_seed(self.seed)
        self.cell = CELLS[self.cell_name](self.input_size, self.hidden).to(self.device)
        self.xs = torch.randn(self.seq_len, self.batch, self.input_size, generator=g).to(
            self.device)
        self.h0 = torch.randn(self.batch, self.hidden, generator=g).to(self.device)
        self.c0 = torch.zeros(self.batch, self.hidden, device=self.device)
        self.params = list(self.cell.parameters())

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA runs asynchronously), so that a host clock
        read after it times the work itself."""
        if self.cuda:
            torch.cuda.synchronize()

    @property
    def lstm(self) -> bool:
        return self.cell_name == "lstm"

    @property
    def state0(self):
        return (self.h0, self.c0) if self.lstm else self.h0

    @property
    def state_bytes(self) -> int:
        return self.h0.nbytes * (2 if self.lstm else 1)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def hidden_of(self, state) -> torch.Tensor:
        return state[0] if self.lstm else state

    def loss(self, state) -> torch.Tensor:
        return (self.hidden_of(state) ** 2).sum()

    def step(self, cell, state, x):
        """``fn(params, state, x) -> new_state``, the step every strategy runs."""
        return cell(x, state)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def grads(self) -> list[torch.Tensor]:
        return [p.grad.detach().clone() for p in self.params]


@dataclass
class Strategy:
    name: str                       # row label
    kind: str                       # "store-all", a peer name, "bincheck"
    gradient: Callable[[], None]
    loop: object = None             # the bincheck loop (its stats, plan)
    num_ckpts: int | None = None
    memory: int | None = None       # memory= budget in bytes
    budget_of: str | None = None    # what the budget was derived from
    extra_grad_bytes: int = 0       # returned gradients besides the parameters' (h0's)
    recomputed: int | None = None   # a peer's recomputed steps, where known (torch's split)
    offload: bool = False           # memory= with offload=True (CUDA: a pinned host tier)


def sqrt_segments(n: int) -> int:
    """√T rounded (32 for T = 1000)."""
    return max(1, round(math.sqrt(n)))


def balanced(n: int, parts: int) -> list[int]:
    """``parts`` segment lengths summing to ``n``, differing by at most one."""
    q, r = divmod(n, parts)
    return [q + 1] * r + [q] * (parts - r)


def store_all(prob: Problem) -> Strategy:
    def gradient():
        s = prob.state0
        for t in range(prob.seq_len):
            s = prob.step(prob.cell, s, prob.xs[t])
        prob.loss(s).backward()
    return Strategy("store-all", "store-all", gradient)


def per_step(prob: Problem) -> Strategy:
    """``checkpoint`` around every step, non-reentrant (the state passed as flat tensors)."""
    def step_flat(*args):
        *s, x = args
        out = prob.step(prob.cell, tuple(s) if prob.lstm else s[0], x)
        return out

    def gradient():
        s = prob.state0
        for t in range(prob.seq_len):
            flat = s if prob.lstm else (s,)
            s = checkpoint(step_flat, *flat, prob.xs[t], use_reentrant=False)
        prob.loss(s).backward()
    return Strategy("checkpoint per step", "per-step", gradient)


def _packed_steps(prob: Problem) -> list[Callable]:
    """One callable per step on a single tensor state, as ``checkpoint_sequential`` needs
    (reentrant checkpoint differentiates only through tensor arguments): the LSTM's (h, c) is
    packed as ``cat([h, c], -1)``."""
    cell, H = prob.cell, prob.hidden

    def make(x):
        if prob.lstm:
            def f(s):
                return torch.cat(cell(x, (s[:, :H], s[:, H:])), -1)
        else:
            def f(s):
                return cell(x, s)
        return f
    return [make(prob.xs[t]) for t in range(prob.seq_len)]


def sequential(prob: Problem, reentrant: bool) -> Strategy:
    segments = sqrt_segments(prob.seq_len)
    functions = _packed_steps(prob)
    s0 = torch.cat([prob.h0, prob.c0], -1) if prob.lstm else prob.h0

    def gradient():
        start = s0.detach().requires_grad_() if reentrant else s0
        s = checkpoint_sequential(functions, segments, start, use_reentrant=reentrant)
        (s[:, :prob.hidden] ** 2).sum().backward()
    name = f"checkpoint_sequential √T={segments}, {'reentrant' if reentrant else 'non-reentrant'}"
    return Strategy(name, "seq-reentrant" if reentrant else "seq-nonreentrant", gradient,
                    extra_grad_bytes=s0.nbytes if reentrant else 0,
                    recomputed=(segments - 1) * (prob.seq_len // segments))


def nested(prob: Problem) -> Strategy:
    """Two levels of non-reentrant checkpoint: √T outer segments, every step inside one."""
    sizes = balanced(prob.seq_len, sqrt_segments(prob.seq_len))
    def step_flat(*args):
        *s, x = args
        return prob.step(prob.cell, tuple(s) if prob.lstm else s[0], x)

    def segment(start, length):
        def run(*s):
            s = tuple(s) if prob.lstm else s[0]
            for t in range(start, start + length):
                flat = s if prob.lstm else (s,)
                s = checkpoint(step_flat, *flat, prob.xs[t], use_reentrant=False)
            return s
        return run

    def gradient():
        s, start = prob.state0, 0
        for n in sizes:
            flat = s if prob.lstm else (s,)
            s = checkpoint(segment(start, n), *flat, use_reentrant=False)
            start += n
        prob.loss(s).backward()
    return Strategy(f"nested checkpoint {len(sizes)}×per-step", "nested", gradient)


def bincheck(prob: Problem, num_ckpts: int | None = None, memory: int | None = None,
             budget_of: str | None = None, offload: bool = False) -> Strategy:
    if memory is None:
        loop = bt.binomial_checkpoint(prob.step, prob.seq_len, num_ckpts)
        name = f"bincheck num_ckpts={num_ckpts}"
    elif offload:
        loop = bt.binomial_checkpoint(prob.step, prob.seq_len, memory=memory, offload=True)
        name = f"bincheck memory= {budget_of}, offload=True"
    else:
        loop = bt.binomial_checkpoint(prob.step, prob.seq_len, memory=memory)
        name = f"bincheck memory= {budget_of}"

    def gradient():
        prob.loss(loop(prob.cell, prob.state0, prob.xs)).backward()
    return Strategy(name, "bincheck", gradient, loop, num_ckpts, memory, budget_of,
                    offload=offload)


def peers(prob: Problem) -> list[Strategy]:
    return [per_step(prob), sequential(prob, True), sequential(prob, False), nested(prob)]

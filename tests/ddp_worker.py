"""Run by tests/test_torch_ddp.py: one rank of a 2-process gloo DDP job on CPU.

Each rank trains a GRU cell through bincheck.torch on its half of a global batch, counts how often
each parameter's gradient hook fires, and writes its gradients to ``<out>/rank<r>.pt``. Rank 0 also
writes the single-process gradient of the whole batch through the plain loop. Each rank leaves with
``os._exit`` right after writing, without tearing the process group down (gloo's teardown was seen
to hang); the parent enforces a timeout on the whole job.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import bincheck.torch as bt

T, B, I, H = 9, 4, 3, 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(I, H).double()
        self.loop = bt.binomial_checkpoint(lambda c, h, x: c(x, h), T, 3)

    def forward(self, h0, xs):
        return self.loop(self.cell, h0, xs)


def data():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(B, H, generator=g, dtype=torch.float64),
            torch.randn(T, B, I, generator=g, dtype=torch.float64))


def main(rank, out, find_unused):
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = Net()
    ddp = nn.parallel.DistributedDataParallel(net, find_unused_parameters=find_unused)
    fired = {n: 0 for n, _ in net.named_parameters()}
    for n, p in net.named_parameters():
        p.register_hook(lambda g, n=n: fired.__setitem__(n, fired[n] + 1))
    h0, xs = data()
    half = slice(rank * B // 2, (rank + 1) * B // 2)
    for _ in range(2):                       # two iterations: DDP's second must work too
        ddp.zero_grad()
        (ddp(h0[half], xs[:, half]) ** 2).sum().div(B // 2).backward()
    result = {"grads": {n: p.grad for n, p in net.named_parameters()}, "fired": fired}
    if rank == 0:
        ref = Net()
        ref.load_state_dict(net.state_dict())
        h = h0
        for t in range(T):
            h = ref.cell(xs[t], h)
        (h ** 2).sum().div(B).backward()
        result["reference"] = {n: p.grad for n, p in ref.named_parameters()}
    torch.save(result, f"{out}/rank{rank}.pt")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1")

"""A worker of tests/test_torch_program.py's DDP test: two gloo processes train the same model
plainly and checkpointed by bincheck; each writes its final parameters and leaves with
``os._exit``."""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(rank: int, world: int, init: str, out: str) -> None:
    import faulthandler
    faulthandler.dump_traceback_later(240, exit=True)   # a hung rank says where, before the
    import bincheck.torch as bt                            # test's deadline kills it
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Dropout(0.2),
                         nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    results = []
    for checkpointed in (False, True):
        model = copy.deepcopy(base)
        inner = bt.checkpoint_module(model, num_ckpts=2) if checkpointed else model
        net = DDP(inner)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        torch.manual_seed(7 + rank)
        for _ in range(3):
            x = torch.randn(8, 6, generator=gen)
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        results.append([t.detach().clone() for t in model.state_dict().values()])
    torch.save(results, f"{out}.{rank}")
    sys.stdout.flush()
    # leave without tearing the process group down, as tests/ddp_worker.py does: gloo's teardown
    # hung here (a rank had written its results and waited in destroy_process_group after its
    # peer had left; seen while other test runs loaded the machine)
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])

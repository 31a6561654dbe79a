"""What an aten op's backward holds beside the gradients it returns, on the CPU, for ops whose
backward was seen to exceed the byte model (round 4 session 9's probes): the source of
``BACKWARD_SCRATCH`` in ``bincheck/torch/costs.py``.

``python -m benchmarks.program.backward_scratch``: each op on a (2, 16, 32, 32) input (or its
own shapes), float32 and float64, the backward's peak of torch-allocated bytes (the profiler's
allocation events) less the gradient it returns, over the largest of the op's tensor arguments
and results. Writes ``results/backward-scratch.md``."""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests"))
from torch_helpers import allocation_peak  # noqa: E402

SHAPE = (2, 16, 32, 32)


def _index(x):
    return torch.randint(0, 64, (x.shape[0], x.shape[1], 32 * 32 // 2))


CASES = {
    "scatter_reduce prod": lambda x: x.flatten(2).scatter_reduce(
        2, _index(x), x.flatten(2)[..., :512], "prod"),
    "scatter_reduce amax": lambda x: x.flatten(2).scatter_reduce(
        2, _index(x), x.flatten(2)[..., :512], "amax"),
    "scatter_reduce prod, src as self": lambda x: x.scatter_reduce(
        3, torch.randint(0, 32, x.shape), x * 2, "prod"),
    "scatter_reduce mean": lambda x: x.flatten(2).scatter_reduce(
        2, _index(x), x.flatten(2)[..., :512], "mean"),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, 3),
    "cumprod": lambda x: torch.cumprod(x, 3),
    "cumsum": lambda x: torch.cumsum(x, 3),
    "unfold (im2col)": lambda x: F.unfold(x, 3, padding=1),
    "fold (col2im)": lambda x: F.fold(x.reshape(2, 64, 256), (32, 32), 2, stride=2),
    "rfft2": lambda x: torch.fft.rfft2(x).abs(),
    "irfft2": lambda x: torch.fft.irfft2(torch.fft.rfft2(x)),
    "max_unpool2d": lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
    "cdist p=1.5": lambda x: torch.cdist(x.flatten(1, 2), x.flatten(1, 2)[:, :64] * 0.5, p=1.5),
    "cdist p=2": lambda x: torch.cdist(x.flatten(1, 2), x.flatten(1, 2)[:, :64] * 0.5),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 7),
    "grid_sample": lambda x: F.grid_sample(x, F.affine_grid(
        torch.eye(2, 3, dtype=x.dtype).expand(2, 2, 3) * 0.9, list(x.shape),
        align_corners=False),
        align_corners=False),
    "interpolate bilinear antialias": lambda x: F.interpolate(
        x, scale_factor=0.5, mode="bilinear", antialias=True),
    "local_response_norm": lambda x: F.local_response_norm(x, 5),
    "masked_select": lambda x: torch.masked_select(x, x > 0),
}


class _Names(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._opname)
        return func(*args, **(kwargs or {}))


def measure(dtype) -> list[tuple]:
    rows = []
    for label, op in CASES.items():
        torch.manual_seed(0)
        x = torch.randn(*SHAPE, dtype=dtype, requires_grad=True)
        names = _Names()
        names.names = []
        with names:
            op(x)
        torch.manual_seed(0)
        y = op(x)
        g = torch.randn_like(y)
        _, peak = allocation_peak(lambda: torch.autograd.grad(y, x, g, retain_graph=True))
        big = max(x.numel() * x.element_size(), y.numel() * y.element_size())
        scratch = peak - x.numel() * x.element_size()
        rows.append((label, str(dtype).replace("torch.", ""), " ".join(dict.fromkeys(
            names.names)), round(scratch / big, 2)))
    return rows


def main() -> None:
    torch.set_num_threads(1)
    rows = measure(torch.float32) + measure(torch.float64)
    out = os.path.join(HERE, "results", "backward-scratch.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"# A CPU backward's scratch over its op's largest tensor (torch "
                f"{torch.__version__}, input {SHAPE}, profiler allocation events)\n\n"
                "| case | dtype | aten ops | scratch / largest |\n|---|---|---|---:|\n")
        for r in rows:
            f.write(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} |\n")
    print(open(out, encoding="utf-8").read())


if __name__ == "__main__":
    main()

"""The byte model of bincheck.torch (costs.py) against the profiler's allocation meter: where a
model's prediction fell short of the measured peak."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import bincheck.torch as bt                                      # noqa: E402
from tests.torch_helpers import allocation_peak                  # noqa: E402


class SharedCell(nn.Module):
    """One linear layer applied at every node of a binary tree (a Tree-LSTM's shape): its weight,
    large beside the activations, is read through ``t`` many times, so each segment's backward
    adds the contributions to its gradient out of place."""

    def __init__(self, hidden: int, depth: int) -> None:
        super().__init__()
        self.cell, self.depth = nn.Linear(hidden, hidden), depth

    def forward(self, x):
        def node(d):
            if d == self.depth:
                return torch.tanh(self.cell(x))
            return torch.tanh(self.cell(node(d + 1) + node(d + 1)))
        return node(0)


@pytest.mark.parametrize("frac", [0.85, 0.92])
def test_shared_weight_accumulation_is_in_the_prediction(frac):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model, x = SharedCell(192, 4), torch.randn(8, 192)
        ref = copy.deepcopy(model)
        _, store_all = allocation_peak(lambda: ref(x).sum().backward())
        net = bt.checkpoint_module(model, memory=int(frac * store_all))
        net(x).sum().backward()                   # plans; the next call reuses the plan
        model.zero_grad(set_to_none=True)
        _, peak = allocation_peak(lambda: net(x).sum().backward())
    finally:
        torch.set_num_threads(old)
    predicted = net.last_plan.peak_bytes + net.stats.trace_bytes
    assert net.stats.taped_ops < net.stats.plain_ops          # it recomputes
    assert peak <= 1.03 * predicted, (peak, predicted, peak / predicted)
    torch.testing.assert_close(model.cell.weight.grad, ref.cell.weight.grad, rtol=1e-4,
                               atol=1e-5)

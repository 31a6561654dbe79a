"""bincheck.torch.checkpoint / checkpoint_module / checkpoint_sequential (issue 31): any forward,
with no annotation, against plain autograd on the same module in float64."""

from __future__ import annotations

import copy
import random

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import bincheck.torch as bt                                      # noqa: E402
from tests.torch_helpers import allocation_peak                  # noqa: E402

RTOL = 1e-10


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


# ---- the four networks, small ------------------------------------------------------

class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu_(self.b1(self.c1(x)))
        return torch.relu(x + self.b2(self.c2(y)))


def resnet(c: int = 6, blocks: int = 3) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c),
                         nn.ReLU(inplace=True), *[Block(c) for _ in range(blocks)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 5))


class Transformer(nn.Module):
    def __init__(self, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Linear(8, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.2, batch_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


class UNet(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(2, c, 3, padding=1), nn.ReLU())
        self.d2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.mid = nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.u1 = nn.Conv2d(2 * c, c, 3, padding=1)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(nn.functional.max_pool2d(a, 2))
        b = torch.relu(self.mid(b)) + b
        u = self.up(b)
        return self.out(torch.relu(self.u1(torch.cat([u, a], dim=1))))


class TreeLSTM(nn.Module):
    """Child-sum TreeLSTM: the recursion follows each input tree."""

    def __init__(self, d: int = 6, h: int = 8) -> None:
        super().__init__()
        self.h = h
        self.iou = nn.Linear(d + h, 3 * h)
        self.f = nn.Linear(d + h, h)

    def node(self, tree, xs):
        idx, kids = tree
        states = [self.node(k, xs) for k in kids]
        x = xs[idx]
        hsum = sum((s[0] for s in states), torch.zeros(self.h))
        i, o, u = self.iou(torch.cat([x, hsum])).chunk(3)
        c = torch.sigmoid(i) * torch.tanh(u)
        for hk, ck in states:
            c = c + torch.sigmoid(self.f(torch.cat([x, hk]))) * ck
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward(self, tree, xs):
        return self.node(tree, xs)[0]


def random_tree(n: int, rng: random.Random):
    nodes = [(0, [])]
    for i in range(1, n):
        nodes[rng.randrange(len(nodes))][1].append((i, []))
        nodes.append(nodes[-1][1][-1] if False else _last_child(nodes, i))
    return nodes[0]


def _last_child(nodes, i):
    for _, kids in nodes:
        if kids and kids[-1][0] == i:
            return kids[-1]
    raise AssertionError


def grads_of(model, inputs, loss, seed=1):
    model.zero_grad(set_to_none=True)
    for x in inputs:
        x.grad = None
    torch.manual_seed(seed)
    value = loss(model)
    value.backward()
    return value.detach(), [p.grad.clone() for p in model.parameters()], \
        [x.grad.clone() for x in inputs]


def assert_close(a, b, rtol=RTOL):
    for u, v in zip(a, b):
        scale = max(v.abs().max().item(), 1e-300)
        assert (u - v).abs().max().item() <= rtol * scale


def same_gradients(model, inputs, loss, **budget):
    ref = copy.deepcopy(model)
    v0, g0, x0 = grads_of(ref, inputs, lambda m: loss(m))
    net = bt.checkpoint_module(model, **budget)
    v1, g1, x1 = grads_of(net, inputs, lambda m: loss(m))
    assert torch.equal(v0, v1) or abs((v0 - v1).item()) <= RTOL * abs(v0.item())
    assert_close(g1, g0)
    assert_close(x1, x0)
    for b1, b0 in zip(model.buffers(), ref.buffers()):
        assert torch.equal(b1, b0)
    return net


@pytest.mark.parametrize("budget", [dict(num_ckpts=2), dict(num_ckpts=5),
                                    dict(memory="300kB")])
def test_resnet_with_batchnorm_in_training_mode(budget):
    model = resnet()
    x = torch.randn(3, 3, 8, 8, requires_grad=True)
    net = same_gradients(model, [x], lambda m: m(x).pow(2).sum(), **budget)
    assert net.stats.ops > 30 and net.stats.taped_ops >= net.stats.ops - 1


@pytest.mark.parametrize("budget", [dict(num_ckpts=3), dict(memory="400kB")])
def test_transformer_with_dropout(budget):
    model = Transformer()
    x = torch.randn(2, 5, 8, requires_grad=True)
    net = same_gradients(model, [x], lambda m: m(x).pow(2).sum(), **budget)
    if "num_ckpts" in budget:
        assert net.stats.plain_ops > net.stats.ops     # recomputed from snapshots


def test_unet_with_skip_connections():
    model = UNet()
    x = torch.randn(2, 2, 8, 8, requires_grad=True)
    same_gradients(model, [x], lambda m: m(x).pow(2).sum(), num_ckpts=3)


def test_treelstm_over_random_trees_each_call_exact():
    model = TreeLSTM()
    net = bt.checkpoint_module(model, num_ckpts=4)
    rng = random.Random(0)
    for n in (9, 15, 15):
        tree = random_tree(n, rng)
        xs = torch.randn(n, 6, requires_grad=True)
        ref = copy.deepcopy(model)
        _, g0, x0 = grads_of(ref, [xs], lambda m: m(tree, xs).sum())
        _, g1, x1 = grads_of(net, [xs], lambda m: m(tree, xs).sum())
        assert_close(g1, g0)
        assert_close(x1, x0)

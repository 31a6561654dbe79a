"""The five workloads of issue 31, written out here (torchvision's CPU wheel for torch 2.13 is not
installed here, so ResNet-18 is its architecture copied, not imported).

Each model's ``forward(..., block=call)`` runs every block it has through ``block(fn, *args)``:
``call`` runs it plainly, ``torch.utils.checkpoint.checkpoint`` per block is the same forward with
another ``block``. A :class:`Workload` holds a model, its inputs (drawn at a seed) and its loss;
``stages()`` is the chain of one-input callables that ``checkpoint_sequential`` takes, where the
model is a chain (None for the U-Net's skips and the TreeLSTM's tree).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def call(fn: Callable, *args):
    """The plain ``block``: run ``fn`` as it is."""
    return fn(*args)


# ---------------------------------------------------------------- ResNet-18 (torchvision's)

def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = conv3x3(cout, cout), nn.BatchNorm2d(cout)
        self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18: a 7×7 stem, four stages of two basic blocks, 1000 classes."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        widths, blocks, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w)]
            cin = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(512, num_classes))
        for m in self.modules():                       # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x, block=call):
        x = self.stem(x)
        for b in self.blocks:
            x = block(b, x)
        return self.head(x)

    def stages(self) -> list[nn.Module]:
        return [self.stem, *self.blocks, self.head]


# ---------------------------------------------------------------- a GPT-2-like transformer

class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d, d), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(B, T, d)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2's layout (pre-LayerNorm blocks, learned positions, tied output embedding), small."""

    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int,
                 dropout: float) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():                       # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def embed(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(pos))

    def logits(self, x):
        return self.ln_f(x) @ self.wte.weight.t()

    def forward(self, tokens, block=call):
        x = self.embed(tokens)
        for b in self.blocks:
            x = block(b, x)
        return self.logits(x)

    def stages(self) -> list[Callable]:
        return [self.embed, *self.blocks, self.logits]


# ---------------------------------------------------------------- a small U-Net

class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(conv3x3(cin, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         conv3x3(cout, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Three 2× downsamplings from ``width`` channels, a bottleneck, three upsamplings with skip
    connections (concatenated), a 1×1 classifier per pixel."""

    def __init__(self, cin: int = 3, classes: int = 2, width: int = 32) -> None:
        super().__init__()
        w = [width * 2**i for i in range(4)]
        self.down = nn.ModuleList([DoubleConv(cin, w[0]), DoubleConv(w[0], w[1]),
                                   DoubleConv(w[1], w[2])])
        self.bottom = DoubleConv(w[2], w[3])
        self.up = nn.ModuleList(nn.ConvTranspose2d(w[i + 1], w[i], 2, 2) for i in (2, 1, 0))
        self.dec = nn.ModuleList(DoubleConv(2 * w[i], w[i]) for i in (2, 1, 0))
        self.out = nn.Conv2d(w[0], classes, 1)

    def forward(self, x, block=call):
        skips = []
        for d in self.down:
            x = block(d, x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = block(self.bottom, x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips)):
            x = block(dec, torch.cat([up(x), skip], 1))
        return self.out(x)


# ---------------------------------------------------------------- a TreeLSTM

class ChildSumCell(nn.Module):
    """Tai et al.'s child-sum Tree-LSTM node: one forget gate per child."""

    def __init__(self, cin: int, hidden: int) -> None:
        super().__init__()
        self.W = nn.Linear(cin, 4 * hidden)
        self.U_iou = nn.Linear(hidden, 3 * hidden, bias=False)
        self.U_f = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, *children):
        """``children``: h_1, c_1, h_2, c_2, ... (none at a leaf). Returns (h, c)."""
        wi, wo, wu, wf = self.W(x).chunk(4, -1)
        hs, cs = children[0::2], children[1::2]
        if hs:
            ui, uo, uu = self.U_iou(sum(hs)).chunk(3, -1)
            wi, wo, wu = wi + ui, wo + uo, wu + uu
        c = torch.sigmoid(wi) * torch.tanh(wu)
        for h_k, c_k in zip(hs, cs):
            c = c + torch.sigmoid(wf + self.U_f(h_k)) * c_k
        return torch.sigmoid(wo) * torch.tanh(c), c


def random_tree(nodes: int, seed: int) -> list[list[int]]:
    """Children lists of a random recursive tree on ``nodes`` nodes, 0 the root: node i > 0
    hangs under a node drawn uniformly from 0..i-1."""
    rng = random.Random(seed)
    children: list[list[int]] = [[] for _ in range(nodes)]
    for i in range(1, nodes):
        children[rng.randrange(i)].append(i)
    return children


class TreeLSTM(nn.Module):
    def __init__(self, cin: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.cell = ChildSumCell(cin, hidden)
        self.cls = nn.Linear(hidden, classes)

    def forward(self, xs, tree: list[list[int]], block=call):
        """``xs``: (nodes, batch, cin), one feature batch per node; Python recursion over
        ``tree`` (a different tree is a different program)."""
        def node(i: int):
            kids = [t for k in tree[i] for t in node(k)]
            return block(self.cell, xs[i], *kids)
        return self.cls(node(0)[0])


# ---------------------------------------------------------------- workloads

@dataclass
class Workload:
    name: str
    describe: str
    model: nn.Module
    inputs: tuple
    loss_of: Callable                   # (model output, inputs) -> scalar
    forward: Callable                   # (block) -> model output
    blocks: int                         # how many blocks ``block`` sees
    stages: list | None = None          # the chain for checkpoint_sequential, or None
    chain_input: torch.Tensor | None = None   # what the chain's first stage takes
    apply: Callable | None = None       # (module) -> output: the model's forward on the inputs,
                                        # for a module standing in for ``model``; None where the
                                        # program is not one module's forward (the RNN's loop)
    extra: dict = field(default_factory=dict)

    def loss(self, block=call) -> torch.Tensor:
        return self.loss_of(self.forward(block))

    def params(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]


SIZES = {
    "quick": dict(resnet=dict(batch=8, image=64), gpt=dict(batch=4, seq=128, d=256, layers=4,
                                                           heads=4, vocab=4096),
                  unet=dict(batch=2, image=64, width=32), tree=dict(nodes=63, batch=16, cin=128,
                                                                    hidden=256),
                  rnn=dict(T=1000, H=256, B=32, I=256)),
    "smoke": dict(resnet=dict(batch=2, image=32), gpt=dict(batch=2, seq=16, d=32, layers=2,
                                                           heads=2, vocab=64),
                  unet=dict(batch=1, image=16, width=4), tree=dict(nodes=7, batch=2, cin=8,
                                                                   hidden=8),
                  rnn=dict(T=12, H=8, B=2, I=8)),
}
NAMES = ("resnet18", "gpt", "unet", "treelstm", "rnn")


def make(name: str, mode: str, seed: int = 0) -> Workload:
    """Workload ``name`` at the sizes of ``mode`` ("quick": issue 31's; "smoke": tiny), its
    parameters and inputs drawn at ``seed``, float32, CPU, training mode."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    s = SIZES[mode]
    if name == "resnet18":
        c = s["resnet"]
        m = ResNet18()
        x = torch.randn(c["batch"], 3, c["image"], c["image"], generator=g)
        y = torch.randint(0, 1000, (c["batch"],), generator=g)
        return Workload(name, f"ResNet-18, batch {c['batch']}, {c['image']}×{c['image']}", m,
                        (x, y), lambda out: F.cross_entropy(out, y),
                        lambda block: m(x, block), len(m.blocks), m.stages(), x,
                        apply=lambda net: net(x))
    if name == "gpt":
        c = s["gpt"]
        m = GPT(c["vocab"], c["seq"], c["d"], c["layers"], c["heads"], dropout=0.1)
        tok = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g)
        x, y = tok[:, :-1], tok[:, 1:]
        return Workload(name, f"GPT-2-like, {c['layers']} layers, d={c['d']}, "
                        f"{c['heads']} heads, seq {c['seq']}, batch {c['batch']}, "
                        f"vocab {c['vocab']}, dropout 0.1",
                        m, (x, y), lambda out: F.cross_entropy(out.flatten(0, 1), y.flatten()),
                        lambda block: m(x, block), len(m.blocks), m.stages(), x,
                        apply=lambda net: net(x))
    if name == "unet":
        c = s["unet"]
        m = UNet(width=c["width"])
        x = torch.randn(c["batch"], 3, c["image"], c["image"], generator=g)
        y = torch.randint(0, 2, (c["batch"], c["image"], c["image"]), generator=g)
        return Workload(name, f"U-Net, width {c['width']}, batch {c['batch']}, "
                        f"{c['image']}×{c['image']}", m, (x, y),
                        lambda out: F.cross_entropy(out, y), lambda block: m(x, block), 7,
                        apply=lambda net: net(x))
    if name == "treelstm":
        c = s["tree"]
        m = TreeLSTM(c["cin"], c["hidden"], 5)
        tree = random_tree(c["nodes"], seed)
        xs = torch.randn(c["nodes"], c["batch"], c["cin"], generator=g)
        y = torch.randint(0, 5, (c["batch"],), generator=g)
        depth = _depth(tree)
        return Workload(name, f"child-sum TreeLSTM, a {c['nodes']}-node random tree (depth "
                        f"{depth}), batch {c['batch']}, in {c['cin']}, H={c['hidden']}", m,
                        (xs, y), lambda out: F.cross_entropy(out, y),
                        lambda block: m(xs, tree, block), c["nodes"],
                        apply=lambda net: net(xs, tree), extra=dict(tree=tree, depth=depth))
    if name == "rnn":
        c = s["rnn"]
        m = nn.RNNCell(c["I"], c["H"])                    # tanh
        xs = torch.randn(c["T"], c["B"], c["I"], generator=g)
        h0 = torch.randn(c["B"], c["H"], generator=g)

        def run(h, block=call):
            for t in range(c["T"]):
                h = block(m, xs[t], h)
            return h
        steps = [_Step(m, xs[t]) for t in range(c["T"])]
        return Workload(name, f"tanh RNN as a plain loop, T={c['T']}, H={c['H']}, B={c['B']}, "
                        f"I={c['I']}", m, (xs, h0), lambda h: (h ** 2).sum(),
                        lambda block: run(h0, block), c["T"], steps, h0,
                        extra=dict(T=c["T"], run=run))
    raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(NAMES)}")


class _Step:
    def __init__(self, cell, x) -> None:
        self.cell, self.x = cell, x

    def __call__(self, h):
        return self.cell(self.x, h)


def _depth(tree: list[list[int]], i: int = 0) -> int:
    return 1 + max((_depth(tree, k) for k in tree[i]), default=0)


def sqrt_segments(n: int) -> int:
    return max(1, round(math.sqrt(n)))

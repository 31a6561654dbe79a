"""Any network through bincheck.torch, no annotation: a BatchNorm CNN trained with
checkpoint_module under a byte budget, and a dropout transformer layer through the
torch.utils.checkpoint drop-in, each checked against the plain model."""

import copy

import torch
from torch import nn

import bincheck.torch as bt

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)


def block(c):
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True))


cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *[block(8) for _ in range(5)],
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
plain = copy.deepcopy(cnn)
net = bt.checkpoint_module(cnn, memory="1.2MB")          # shares cnn's parameters and buffers
opt, plain_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, plain))

x, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
for step in range(3):                                   # steps 2 and 3 reuse step 1's plan
    for model, o in ((net, opt), (plain, plain_opt)):
        o.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        o.step()
for a, b in zip(cnn.state_dict().values(), plain.state_dict().values()):
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)   # weights and running statistics
print("cnn:", net.stats.ops, "ops recorded,", net.stats.plain_ops, "plain,",
      net.stats.taped_ops, "replayed for the backward; predicted peak",
      net.preview(x).peak_bytes, "bytes")

layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
h = torch.randn(2, 10, 32, requires_grad=True)
mask = torch.zeros(2, 10, dtype=torch.bool)
torch.manual_seed(1)
(g_plain,) = torch.autograd.grad(layer(h, src_key_padding_mask=mask).sum(), h)
torch.manual_seed(1)                                    # the same dropout masks
y = bt.checkpoint(layer, h, num_ckpts=3, src_key_padding_mask=mask)
(g,) = torch.autograd.grad(y.sum(), h)
assert torch.allclose(g, g_plain, rtol=1e-10, atol=1e-12)
print("transformer layer:", bt.last_stats().snapshots, "snapshots at most")

"""A character-level language model on an nn.LSTMCell, trained through bincheck.torch with a loss
at every step (output_fn), checked against the plain loop."""

import torch
from torch import nn

import bincheck.torch as bt

torch.manual_seed(0)
T, B, V, H = 200, 8, 20, 32                      # steps, batch, vocabulary, hidden units


class CharLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.cell, self.head = nn.Embedding(V, H), nn.LSTMCell(H, H), nn.Linear(H, V)
        self.loop = bt.binomial_checkpoint(self.step, T, num_ckpts=10, output_fn=self.loss)

    @staticmethod
    def step(model, state, x):                   # fn(params, state, x): params is the module
        return model.cell(model.embed(x["chars"]), state)

    @staticmethod
    def loss(model, state, x):                   # output_fn: step t's loss, from its new state
        return nn.functional.cross_entropy(model.head(state[0]), x["targets"])

    def forward(self, text):
        zeros = torch.zeros(text.shape[1], H)
        _, losses = self.loop(self, (zeros, zeros), {"chars": text[:-1], "targets": text[1:]})
        return losses.mean()                     # losses: (T,), one per step


text = torch.randint(V, (T + 1, B))
model = CharLM()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(5):
    optimizer.zero_grad()
    loss = model(text)
    loss.backward()                              # reaches every parameter exactly once
    optimizer.step()
print(f"loss {loss.item():.3f}; per gradient: {model.loop.stats.plain_steps} plain and "
      f"{model.loop.stats.taped_steps} taped steps")

# The same gradient as the plain loop's:
model.zero_grad()
model(text).backward()
ours = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
state, losses = (torch.zeros(B, H), torch.zeros(B, H)), []
for t in range(T):
    x = {"chars": text[t], "targets": text[t + 1]}
    state = CharLM.step(model, state, x)
    losses.append(CharLM.loss(model, state, x))
torch.stack(losses).mean().backward()
for a, p in zip(ours, model.parameters()):
    torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)

"""The bytes and seconds of a recorded forward (:mod:`.trace`) as a planner's
:class:`~bincheck.schedule.chain.Chain`: what :mod:`.program` plans over.

Every quantity is read off the trace, op by op, and priced in the chain's terms per stage (a run
of ops between two cuts):

* ``cuts[c]``: the storages live at the cut (defined before it, read after it), each once: what a
  snapshot there holds.
* ``tape[k]``: the storages made in stage ``k`` that autograd saved: what a replay of it keeps for
  the backward. (A saved value made before the stage is in its input cut, counted there.)
* ``adj[c]``: the gradients autograd holds while its backward is at the cut: those of the values
  requiring grad live across it, each once (autograd frees a gradient when the node that made
  its value has used it), and those of the parameters and inputs read after it (a parameter's
  gradient exists from its last use's backward on, and stays). The inputs ``cat`` reads last get
  views of its output's gradient: that storage is held, once, until the earliest is taken.
* ``spike[k]``: the most that stage ``k`` holds beyond its two cuts while it runs plainly: op
  ``j`` holds the storages live at it and its results.
* ``back[k]``: the most it holds beyond the tapes, the segment's input cut and ``adj`` while
  it is taped: replayed, op ``j`` holds the storages live at it that no node saved and its
  results that none saved; pulled back, the gradients live after it and those its backward
  makes (its tensor inputs' that require grad, none for a view; :func:`scratch`; and
  :func:`accumulation`, a shared weight's gradient summed out of place). At the
  last stage, the caller's backward of its loss, which runs before it with what checkpointing
  holds then (the first taped segment, kept by the forward), holds ``CALLER_COTANGENTS - 1``
  more times the output's gradients, if that is more.

What the model leaves out (the ops' internal scratch, autograd's nodes, a gradient cloned
where its layout differs from its parameter's) is what ``MODEL_SHARE`` in :mod:`.program`
leaves room for; measured peaks against predictions are in
benchmarks/program/results/budgets.md.
"""

from __future__ import annotations

import numpy as np

from ..schedule.chain import Chain
from .ops import unflatten_args
from .trace import Trace

# what a taped op costs beside three times its plain time (autograd's node, the replay's Python)
TAPED_OVERHEAD_S = 2e-5
# what a snapshot and the sweep hold beside the tensors' bytes (dicts, the executor's tables)
SNAPSHOT_OVERHEAD_B = 512
SWEEP_OVERHEAD_B = 16 * 1024
# the caller's loss, pulled back at the output, holds this many of the output's gradients'
# bytes (a cross-entropy: its saved log-probabilities, the cotangent it gets, the one it gives)
CALLER_COTANGENTS = 3
# ops whose backward returns its inputs' gradients as views of its output's
VIEWING_BACKWARDS = {"cat", "stack"}
# views whose backward gives a non-contiguous gradient (one the engine adds out of place)
TRANSPOSING_VIEWS = {"t", "transpose", "permute"}
# the copies of a leaf's gradient an out-of-place accumulation holds beside the model's one: the
# new sum (the leaf's own gradient beside the engine's buffer, from a segment's backward on,
# priced as well, over-predicted the TreeLSTM's peak by 14-26 %)
ACCUMULATED_COPIES = 1


def _spans(n: int, spans) -> np.ndarray:
    """Per cut ``0..n``: the sum of ``nbytes`` over the ``(first, last, nbytes)`` spans
    covering it."""
    diff = np.zeros(n + 2, dtype=np.int64)
    for a, b, nb in spans:
        diff[a] += nb
        diff[min(b, n) + 1] -= nb
    return np.cumsum(diff)[:n + 1]


def cut_bytes(tr: Trace, unsaved: bool = False) -> np.ndarray:
    """Bytes live at each cut ``0..n``: each storage group with a value defined before the cut
    and read after it, counted once (with ``unsaved``, only groups no node saved)."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for v, g in enumerate(tr.group):
        d, u = tr.defined[v] + 1, tr.last[v]
        if d <= u:
            lo[g] = min(lo.get(g, d), d)
            hi[g] = max(hi.get(g, u), u)
    return _spans(tr.n, ((a, hi[g], tr.group_bytes[g]) for g, a in lo.items()
                         if not (unsaved and tr.saved[g])))


def adjoint_bytes(tr: Trace) -> np.ndarray:
    """``adj`` of the module docstring, per cut ``0..n``."""
    grads = list(tr.grad_bytes)
    views = []
    for j in range(tr.n):
        if tr.func(j)._opname in VIEWING_BACKWARDS:
            # the gradients of the inputs it reads last are views of its output's: that storage
            # is held, once, from its backward until the earliest of them is taken (priced as
            # the output for each input, a stack of T steps cost T times its output: least
            # budgets 5-37x store-all's peak)
            made = []
            for v in tr.values(j):
                if v >= 0 and grads[v] and tr.last[v] == j:
                    made.append(tr.defined[v])
                    grads[v] = 0
            if made:
                views.append((min(made) + 1, j, int(tr.out_bytes[j])))
    values = ((tr.defined[v] + 1, tr.last[v], nb) for v, nb in enumerate(grads)
              if nb and tr.defined[v] < tr.last[v])
    externals = ((0, u, t.numel() * t.element_size())
                 for t, g, u in zip(tr.externals, tr.ext_grad, tr.ext_last) if g)
    return _spans(tr.n, (*values, *externals, *views))


def tape_made(tr: Trace) -> np.ndarray:
    """Per op: the bytes of the storages it made that autograd saved."""
    made = np.zeros(tr.n, dtype=np.int64)
    seen: set[int] = set()
    for v, g in enumerate(tr.group):
        if tr.saved[g] and g not in seen:
            seen.add(g)
            made[tr.defined[v]] += tr.group_bytes[g]
    return made


def merged(tr: Trace, bounds: list[int]) -> list[int]:
    """``bounds`` less the cuts a plan never needs under a budget: cut ``c`` where the stage
    before it (from the last cut kept, ``p``) tapes nothing and ``c`` holds at least ``p``'s
    bytes. Taping from ``p`` instead holds no more (its cut is no larger, the stage adds no tape)
    and replays that stage once where a plan through ``c`` advances it and tapes it again: a
    GPT's logits, made by its last ``mm`` (whose saved inputs were made before it) and
    reshaped, were a stage of their own whose input cut, 8 MiB, set its least budget."""
    live = cut_bytes(tr)
    cum = np.concatenate([[0], np.cumsum(tape_made(tr))])
    kept = [bounds[0]]
    for c in bounds[1:-1]:
        p = kept[-1]
        if not (cum[c] == cum[p] and live[c] >= live[p]):
            kept.append(c)
    kept.append(bounds[-1])
    return kept


def freed_in_stage(tr: Trace, bounds: list[int]) -> np.ndarray:
    """Per op ``j``: the bytes of its stage's tape (:func:`tape_made`) already freed when its
    backward runs: storages made in ``j``'s stage whose savers all come after ``j`` (autograd
    frees a saved tensor once the last node saving it, the earliest in the forward, has run;
    BatchNorm's output saved only by the ``relu_`` after it is gone when BatchNorm's backward
    runs). A Reverse's bound holds the whole stage's tape (:func:`~bincheck.schedule.chain.
    reverse_bytes`); ``back`` takes this off it."""
    n = tr.n
    out = np.zeros(n + 1, dtype=np.int64)
    starts = np.asarray(tr.saver_start)
    if n == 0 or starts[-1] == 0:
        return out[:n]
    group = np.asarray(tr.group, dtype=np.int64)
    groups = len(tr.group_bytes)
    first = np.full(groups, n, dtype=np.int64)              # per group: its earliest saver
    np.minimum.at(first, np.repeat(group, np.diff(starts)), np.asarray(tr.saver_ks))
    made = np.full(groups, n, dtype=np.int64)               # and the op that made it
    np.minimum.at(made, group, np.asarray(tr.defined))
    saved = np.frombuffer(bytes(tr.saved), dtype=np.uint8).astype(bool) & (first < n)
    b = np.asarray(bounds, dtype=np.int64)
    stage = np.searchsorted(b[1:], made[saved], side="right")      # the maker's stage
    lo, hi = b[stage], np.minimum(first[saved], b[stage + 1])    # its ops before the saver
    nb = np.asarray(tr.group_bytes, dtype=np.int64)[saved]
    ok = lo < hi
    np.add.at(out, lo[ok], nb[ok])
    np.add.at(out, hi[ok], -nb[ok])
    return np.cumsum(out)[:n]


# what these ops' backward holds beside the gradients it returns, on the CPU, in multiples of
# the largest of their tensor arguments and result, rounded up from
# benchmarks/program/results/backward-scratch.md (``python -m benchmarks.program.
# backward_scratch``; a probe measured chains of them at up to 2.6x ``memory=``)
BACKWARD_SCRATCH = {"scatter_reduce": 12.6, "logcumsumexp": 7.0, "cumprod": 3.3, "cumsum": 2.0,
                    "_fft_r2c": 4.1, "_fft_c2r": 4.1, "_fft_c2c": 4.1, "_cdist_forward": 2.1,
                    "_euclidean_dist": 2.3}


def scratch(tr: Trace) -> np.ndarray:
    """Per op: the temporary its backward allocates beside the gradients it returns, where
    measured: BatchNorm's and convolution's on CPU hold one more of their widest recorded
    input's size (under the profiler's meter: ResNet-18's stem, the U-Net), a weight's
    included (the U-Net's 3x3 convolutions of 256 channels hold a second 2.25 MiB beside
    their weight's gradient)."""
    out = np.zeros(tr.n, dtype=np.int64)
    ext, ext_grad = tr.externals, tr.ext_grad
    for j in range(tr.n):
        name = tr.func(j)._opname
        if "batch_norm" in name or "convolution" in name:
            out[j] = max((tr.grad_bytes[v] if v >= 0 else
                          ext[-1 - v].numel() * ext[-1 - v].element_size()
                          if ext_grad[-1 - v] else 0 for v in tr.values(j)), default=0)
        if name == "convolution":
            out[j] = max(out[j], conv_scratch(tr, j))
        elif name in BACKWARD_SCRATCH:
            out[j] = max(out[j], int(BACKWARD_SCRATCH[name] * max(
                [int(tr.out_bytes[j])] + [_bytes(tr, v) for v in tr.values(j)])))
    return out


def _bytes(tr: Trace, v: int) -> int:
    """A value's storage bytes, an external's (the user's tensor) too."""
    if v >= 0:
        return tr.group_bytes[tr.group[v]]
    t = tr.externals[-1 - v]
    return t.numel() * t.element_size()


def conv_scratch(tr: Trace, j: int) -> int:
    """What a CPU convolution's backward (``j``, kernel larger than 1x1) holds beside its
    gradients, as measured under the profiler's meter (a probe found 3x3 convolutions 1.3-1.4x
    their predicted peak): oneDNN's (float32, bfloat16, float16) at most twice its input and its
    output once (``2 in + out``: 3.01 MiB measured for 24 to 8 channels, 64x64, batch 4, 3.0
    by this), or its weight's size where larger; the slow path's (float64) its im2col columns,
    the kernel's size times the input channels times the output pixels (27 MiB there, 9 times
    the input). A weight cast in the function (CPU autocast) is priced at its cast's size."""
    func, spec, consts, _, _ = tr.templates[tr.tmpl[j]]
    vals = tr.values(j)
    if len(vals) < 2:
        return 0
    src = vals[1]                       # a weight made in the function (autocast's cast): the
    for _ in range(3):                  # parameter it was made from gives its shape
        if src < 0 or not tr.values(tr.defined[src]):
            break
        src = tr.values(tr.defined[src])[0]
    if src >= 0:
        return 0
    w = tr.externals[-1 - src]
    size = w.element_size() if vals[1] < 0 else \
        tr.group_bytes[tr.group[vals[1]]] // max(1, w.numel())
    kk = int(np.prod(w.shape[2:])) if w.dim() > 2 else 1
    if kk == 1 or w.device.type != "cpu":
        return 0
    inb, outb = _bytes(tr, vals[0]), int(tr.out_bytes[j])
    if size in (2, 4):                  # float32, bfloat16, float16
        return max(2 * inb + outb, w.numel() * size)
    args = unflatten_args(list(consts), spec)[0]
    groups = args[8] if len(args) > 8 and type(args[8]) is int else 1
    if len(args) > 6 and args[6]:           # transposed: (in, out / groups, ...) weights
        return kk * inb * w.shape[1] * groups // max(1, w.shape[0])
    return kk * outb * w.shape[1] * groups // max(1, w.shape[0])


def accumulation(tr: Trace) -> np.ndarray:
    """Per op: what autograd's accumulation of a leaf's gradient holds at its backward beside
    the gradients the model counts. A leaf requiring grad (a parameter, an input) read through
    a transposing view (``t``, ``transpose``, ``permute``: a linear's weight) gets
    non-contiguous contributions; the engine's input buffer keeps the first one to arrive (the
    last read's) and adds the second (the read before it) out of place: the new sum beside the
    old one and the contribution (both in ``adj``). The sum is contiguous and the buffer's own,
    so every later contribution is added in place (torch's ``InputBuffer::accumulate``): only
    the second-to-last read pays."""
    out = np.zeros(tr.n, dtype=np.int64)
    later: dict[int, int] = {}
    for j in range(tr.n - 1, -1, -1):
        if tr.func(j)._opname not in TRANSPOSING_VIEWS:
            continue
        for v in tr.values(j):
            if v < 0 and tr.ext_grad[-1 - v]:
                e = -1 - v
                if later.get(e, 0) == 1:
                    t = tr.externals[e]
                    out[j] += ACCUMULATED_COPIES * t.numel() * t.element_size()
                later[e] = later.get(e, 0) + 1
    return out


def chain_of(tr: Trace, bounds: list[int], work: int) -> Chain:
    """The chain of the stages ``bounds[k]..bounds[k+1]-1`` of ``tr``, with ``work`` bytes held
    throughout beside the module docstring's."""
    starts = bounds[:-1]
    live = cut_bytes(tr)
    cuts = live[bounds]
    out = np.asarray(tr.out_bytes, dtype=np.int64)
    adj = adjoint_bytes(tr)
    tape = tape_made(tr)
    plain = live[:-1] + out                          # op j run plainly
    replayed = cut_bytes(tr, unsaved=True)[:-1] + out - tape   # saved results: the tape's
    pulled = adj[1:] + np.asarray(tr.grad_in, dtype=np.int64) + scratch(tr) + \
        accumulation(tr) - freed_in_stage(tr, bounds)
    spike = np.maximum(np.maximum.reduceat(plain, starts) - cuts[:-1] - cuts[1:], 0)
    back = np.maximum(np.maximum.reduceat(replayed, starts),
                      np.maximum.reduceat(pulled, starts) - adj[bounds[1:]])
    n = tr.n
    back[-1] = max(back[-1], (CALLER_COTANGENTS - 1) * sum(
        nb for v, nb in enumerate(tr.grad_bytes) if tr.last[v] == n))
    seconds = np.add.reduceat(np.asarray(tr.seconds, dtype=np.float64), starts)
    counts = np.diff(bounds)
    # a taped segment is a replay keeping what autograd saved: as long as a plain one
    return Chain(seconds, seconds + TAPED_OVERHEAD_S * counts,
                 np.add.reduceat(tape, starts), cuts + SNAPSHOT_OVERHEAD_B,
                 work + SWEEP_OVERHEAD_B, spike, adj[bounds], np.maximum(back, 0))

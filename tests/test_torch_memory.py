"""Memory of bincheck.torch under an independent meter: the profiler's allocation events (torch's
CPU allocator is invisible to tracemalloc)."""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from torch_helpers import Counter, allocation_peak, problem, requiring, tanh_cell  # noqa: E402

T, B, H, I = 200, 32, 64, 16
STATE = B * H * 4


@pytest.fixture(scope="module")
def rnn():
    params, h0, xs = problem(T, B, H, I, dtype=torch.float32)
    leaves = requiring(*params)

    def gradient(loop=None):
        def run():
            if loop is not None:
                out = loop(tuple(leaves), h0, xs)
            else:
                out = h0
                for t in range(T):
                    out = tanh_cell(tuple(leaves), out, xs[t])
            return torch.autograd.grad(out.pow(2).sum(), leaves)
        return allocation_peak(run)
    grads, store_all = gradient()
    return leaves, h0, xs, gradient, store_all, sum(g.numel() * 4 for g in grads)


def test_the_meter_sees_torch_allocations():
    _, peak = allocation_peak(lambda: [torch.ones(1 << 18) for _ in range(4)])
    assert peak == 4 * (1 << 20)


def test_checkpoints_save_most_of_store_alls_peak(rnn):
    leaves, h0, xs, gradient, store_all, _ = rnn
    assert store_all > 190 * STATE        # store-all keeps about a state per step here
    peaks = {}
    for s in (5, 10, 20):
        _, peaks[s] = gradient(bt.binomial_checkpoint(tanh_cell, T, s))
        # s stored states, each with its RNG state (5056 bytes on CPU), and a working set of a
        # few states, one step's tape and the parameters' gradients (measured: 14.7 states)
        assert peaks[s] <= s * (STATE + 5056) + 18 * STATE, (s, peaks[s] / STATE)
    assert peaks[10] <= 0.2 * store_all
    assert peaks[5] < peaks[10] < peaks[20]


@pytest.mark.parametrize("fraction", [0.12, 0.2, 0.5])
def test_memory_budget_holds_under_the_meter(rnn, fraction):
    leaves, h0, xs, gradient, store_all, grad_bytes = rnn
    memory = int(fraction * store_all)
    loop = bt.binomial_checkpoint(tanh_cell, T, memory=memory)
    plan = loop.preview(tuple(leaves), h0, xs)
    _, peak = gradient(loop)
    # the returned gradients are the caller's, not the loop's
    assert peak - grad_bytes <= memory, (peak - grad_bytes, memory)
    assert loop.stats.peak_bytes <= plan.peak_bytes <= memory
    assert loop.stats.plain_steps == plan.plain_steps


def test_budget_below_the_minimum_is_refused_before_the_forward(rnn):
    leaves, h0, xs, *_ = rnn
    cell = Counter(tanh_cell)
    loop = bt.binomial_checkpoint(cell, T, memory="20kB")
    with pytest.raises(ValueError, match=r"memory=20000 bytes is below the least this loop needs"
                                         r".* \d+ bytes in all"):
        loop(tuple(leaves), h0, xs)
    # the probe measured step 0 (twice plain, twice taped); no other step ran
    assert cell.plain <= 2 and cell.taped <= 2


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_memory_budget_holds_when_parameters_dominate(kind):
    """Weights larger than the states: the parameter-gradient buffers of a reverse step are what
    the budget must leave room for (one parameter-sized buffer fewer went over, measured)."""
    from torch import nn
    torch.manual_seed(0)
    T2, B2, I2, H2 = 100, 8, 64, 128
    cell = (nn.LSTMCell if kind == "lstm" else nn.GRUCell)(I2, H2)
    xs, h0 = torch.randn(T2, B2, I2), torch.zeros(B2, H2)
    state = (h0, h0.clone()) if kind == "lstm" else h0
    step = lambda c, s, x: c(x, s)                                  # noqa: E731
    first = (lambda o: o[0]) if kind == "lstm" else (lambda o: o)   # noqa: E731
    params = list(cell.parameters())
    grad_bytes = sum(p.numel() * 4 for p in params)

    def plain():
        s = state
        for t in range(T2):
            s = step(cell, s, xs[t])
        return torch.autograd.grad(first(s).pow(2).sum(), params)
    _, store_all = allocation_peak(plain)
    for fraction in (0.35, 0.6):
        loop = bt.binomial_checkpoint(step, T2, memory=int(fraction * store_all))
        _, peak = allocation_peak(
            lambda: torch.autograd.grad(first(loop(cell, state, xs)).pow(2).sum(), params))
        assert peak - grad_bytes <= fraction * store_all, (fraction, peak - grad_bytes)


@pytest.mark.parametrize("kind", ["functional", "rnn", "gru", "lstm"])
def test_a_kept_segment_holds_what_its_step_tape_predicts(kind):
    """Per step of a kept segment the plan counts ``tape_bytes``: the storages an L-step chain
    saves (counted with a pack hook, each once) are L of them, give or take one state."""
    torch.manual_seed(0)
    L, I2, H2, B2 = 12, 8, 32, 4
    if kind == "functional":
        params, h0, xs = problem(L, B2, H2, I2, dtype=torch.float32)
        params, step = tuple(requiring(*params)), tanh_cell
    else:
        params = {"rnn": torch.nn.RNNCell, "gru": torch.nn.GRUCell,
                  "lstm": torch.nn.LSTMCell}[kind](I2, H2)
        h0 = torch.randn(B2, H2)
        h0 = (h0, torch.randn(B2, H2)) if kind == "lstm" else h0
        xs = torch.randn(L, B2, I2)

        def step(cell, h, x):
            return cell(x, h)
    sizes = bt.binomial_checkpoint(step, L, memory="1GB").preview(params, h0, xs).sizes
    owned = {p.untyped_storage().data_ptr() for p in
             (params.parameters() if kind != "functional" else params)}
    owned.add(xs.untyped_storage().data_ptr())
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in owned:
            seen[ptr] = t.untyped_storage().nbytes()
        return t
    leaves = [v.detach().requires_grad_() for v in (h0 if kind == "lstm" else (h0,))]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        state = tuple(leaves) if kind == "lstm" else leaves[0]
        for t in range(L):
            state = step(params, state, xs[t])
    held = sum(seen.values()) + sum(v.untyped_storage().nbytes() for v in leaves
                                    if v.untyped_storage().data_ptr() not in seen)
    state_bytes = sum(v.nbytes for v in leaves)
    assert L * sizes.tape_bytes <= held + state_bytes, (kind, held, sizes.tape_bytes)
    assert held <= L * sizes.tape_bytes + state_bytes, (kind, held, sizes.tape_bytes)


@pytest.mark.parametrize("kind", ["rnn", "gru"])
def test_a_budget_near_the_minimum_holds_under_the_meter(kind):
    """At budgets one and three states above the loop's minimum (states only, few slots), the
    metered peak of the loop's own bytes stays within the budget."""
    import re
    from torch import nn
    torch.manual_seed(0)
    T2, B2, I2, H2 = 60, 16, 32, 64
    cell = (nn.RNNCell if kind == "rnn" else nn.GRUCell)(I2, H2)
    xs, h0 = torch.randn(T2, B2, I2), torch.zeros(B2, H2)
    step = lambda c, s, x: c(x, s)                                  # noqa: E731
    params = list(cell.parameters())
    grad_bytes = sum(p.numel() * 4 for p in params)
    with pytest.raises(ValueError) as refused:
        bt.binomial_checkpoint(step, T2, memory=1).preview(cell, h0, xs)
    minimum = int(re.search(r"(\d+) bytes in all", str(refused.value)).group(1))
    for extra in (1, 3):
        memory = minimum + extra * h0.nbytes
        loop = bt.binomial_checkpoint(step, T2, memory=memory)
        _, peak = allocation_peak(
            lambda: torch.autograd.grad(loop(cell, h0, xs).pow(2).sum(), params))
        assert loop.stats.plain_steps == loop.last_plan.plain_steps
        assert peak - grad_bytes <= memory, (extra, peak - grad_bytes, memory)


@pytest.mark.parametrize("case", ["output_fn", "inputs"])
def test_kept_segments_count_what_output_fn_and_wanted_inputs_hold(case):
    """A kept segment also holds, each step, the cotangent ``output_fn`` pulls back into the
    state, or the wanted input slice's cotangent: the backward's metered peak (beside the
    returned gradients) stays within budgets that keep taped segments."""
    import re
    torch.manual_seed(0)
    T2, B2, H2, I2 = 120, 16, 64, 64 if case == "output_fn" else 256
    W = (torch.randn(H2, H2) * 0.1).requires_grad_()
    U = (torch.randn(I2, H2) * 0.1).requires_grad_()
    V = (torch.randn(H2, 8) * 0.1).requires_grad_()
    xs, h0 = torch.randn(T2, B2, I2), torch.randn(B2, H2)
    step = lambda p, h, x: torch.tanh(h @ p[0] + x @ p[1])       # noqa: E731
    kw = {"output_fn": lambda p, h, x: h @ p[2]} if case == "output_fn" else {}
    params = (W, U, V) if case == "output_fn" else (W, U)
    if case == "inputs":
        xs.requires_grad_()
    wrt = params + ((xs,) if case == "inputs" else ())
    returned = sum(v.numel() * 4 for v in wrt)
    with pytest.raises(ValueError) as refused:
        bt.binomial_checkpoint(step, T2, memory=1, **kw).preview(params, h0, xs)
    minimum = int(re.search(r"(\d+) bytes in all", str(refused.value)).group(1))
    kept = []
    for extra in (30, 60, 120):
        memory = minimum + extra * h0.nbytes
        loop = bt.binomial_checkpoint(step, T2, memory=memory, **kw)
        out = loop(params, h0, xs)
        loss = out[0].sum() + out[1].sum() if case == "output_fn" else out.sum()
        _, peak = allocation_peak(lambda: torch.autograd.grad(loss, wrt))
        kept.append(loop.last_plan.sizes.tape_bytes is not None)
        assert peak - returned <= memory, (extra, peak - returned, memory)
    assert any(kept), kept                       # a budget where taped segments are kept


def elementwise_problem():
    """A step whose parameter is as large as its state (256 KiB): what the probe and the sweep
    hold beside the budget shows at once."""
    torch.manual_seed(0)
    T2, N = 40, 64 * 1024
    w = torch.randn(N, requires_grad=True)
    xs, h0 = torch.randn(T2, N), torch.randn(N)
    return (lambda p, h, x: torch.tanh(h * p + x)), T2, w, h0, xs


def test_a_preview_leaves_nothing_allocated():
    """The probe tapes a step with a pack hook and keeps its graph for a second backward; none
    of it may outlive the preview (it did: three states at every probe, a cycle through the
    graph torch's C++ holds)."""
    fn, T2, w, h0, xs = elementwise_problem()
    for memory in ("20MB", None):
        loop = bt.binomial_checkpoint(fn, T2, memory=memory) if memory else \
            bt.binomial_checkpoint(fn, T2, 3)
        if memory is None:
            _, _, left = allocation_peak(lambda: torch.autograd.grad(
                loop(w, h0, xs).sum(), [w]), net=True)
            assert left == w.nbytes, left          # the returned gradient, nothing else
            continue
        _, _, left = allocation_peak(lambda: loop.preview(w, h0, xs), net=True)
        assert left == 0, left


def test_the_first_gradient_holds_a_budget_at_the_minimum():
    """The first gradient of a ``memory=`` loop probes a step, then runs the plan: at the
    minimum budget and one and two states above it (one to three slots, every reversed step
    alone, or a kept segment where one now fits and is faster), the metered peak beside the
    returned gradient stays within the budget."""
    import re
    fn, T2, w, h0, xs = elementwise_problem()
    with pytest.raises(ValueError) as refused:
        bt.binomial_checkpoint(fn, T2, memory=1).preview(w, h0, xs)
    minimum = int(re.search(r"(\d+) bytes in all", str(refused.value)).group(1))
    for extra in (0, 1, 2):
        memory = minimum + extra * h0.nbytes
        loop = bt.binomial_checkpoint(fn, T2, memory=memory)
        _, peak = allocation_peak(lambda: torch.autograd.grad(loop(w, h0, xs).pow(2).sum(), [w]))
        schedule = loop.last_plan.schedule
        if hasattr(schedule, "num_ckpts"):                  # states only: 1-3 slots
            assert schedule.num_ckpts == extra + 1
        assert peak - w.nbytes <= memory, (extra, (peak - w.nbytes - memory) / h0.nbytes)


def _doubling_tanh(wide_backward):
    """``tanh(2 h)`` as an autograd.Function saving ``h``; with ``wide_backward``, its backward
    also builds and differentiates a graph 50 states wide (as a Function that recomputes under
    ``enable_grad`` in its backward does)."""
    class DoublingTanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            ctx.save_for_backward(h)
            return torch.tanh(2.0 * h)

        @staticmethod
        def backward(ctx, g):
            (h,) = ctx.saved_tensors
            if wide_backward:
                with torch.enable_grad():
                    hh = h.detach().requires_grad_()
                    torch.autograd.grad(torch.exp(hh.repeat(1, 50)).sum(), hh)
            return g * 2.0 * (1.0 - torch.tanh(2.0 * h) ** 2)
    return DoublingTanh.apply


def test_the_probe_counts_what_the_forward_saves_not_what_the_backward_builds():
    """Two steps with the same forward (saving the same tensors) have the same tape and working
    set, though one's backward builds a graph of its own: tensors the backward saves are not
    the step's tape (they were counted when the backward ran inside the probe's hooks)."""
    params, h0, xs = problem(30, B=8, H=64, I=4)
    leaves = tuple(requiring(*params))
    sizes = []
    for wide in (False, True):
        act = _doubling_tanh(wide)

        def step(p, h, x):
            W, U, b = p
            return act(h @ W + x @ U + b)
        sizes.append(bt.binomial_checkpoint(step, 30, memory="1GB").preview(leaves, h0, xs)
                     .sizes)
    narrow, wide = sizes
    assert wide.tape_bytes == narrow.tape_bytes and wide.work_bytes == narrow.work_bytes, \
        (narrow, wide)
    assert narrow.tape_bytes < 50 * h0.numel() * h0.element_size()

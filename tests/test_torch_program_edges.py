"""bincheck.torch.checkpoint where a user's forward or caller does something unusual: an explicit
``torch.Generator``, a result written in place by the caller, ``t.data = ...`` inside the
function (found by an adversarial probe, round 4 session 9). Oracle: plain autograd, float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import bincheck.torch as bt                                      # noqa: E402
from tests.torch_helpers import float64_default                 # noqa: E402

RTOL = 1e-10


@pytest.fixture(autouse=True)
def _float64():
    yield from float64_default()


@pytest.mark.parametrize("kw", [dict(num_ckpts=1), dict(num_ckpts=2), dict(memory=10 ** 6)])
def test_an_explicit_generator_replays_its_draws_and_is_left_as_the_plain_run_leaves_it(kw):
    """A replay drew from the caller's generator as the forward had left it (the state after
    the forward's draws): another noise, another gradient, and the generator advanced again."""
    gen = torch.Generator()

    def f(x):
        h = x
        for _ in range(4):
            h = (h.tanh() * torch.randn(x.shape, generator=gen)).sin() + h
        return h

    def run(call):
        gen.manual_seed(5)
        x = torch.linspace(-1, 1, 6, requires_grad=True)
        call(x).sum().backward()
        return x.grad, torch.rand(3, generator=gen)
    want, after = run(f)
    for _ in range(2):                      # the second call runs the plan it expected
        got, got_after = run(lambda x: bt.checkpoint(f, x, **kw))
        torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
        assert torch.equal(got_after, after)


def _reads_its_result_later(x):
    y = x * 2                       # returned, saved by no node
    h = y + 1
    for _ in range(6):
        h = (h * 1.1 + y).sin()
    return y, h


@pytest.mark.parametrize("num_ckpts", [2, 3])
@pytest.mark.parametrize("grad_mode", [False, True])
def test_a_result_the_caller_writes_into_after_the_forward_leaves_the_gradient_exact(
        num_ckpts, grad_mode):
    """From the second call on, the forward takes the plan's snapshots by reference: a
    result the caller then wrote into (legal: no node saved it) was read back by the replays."""
    def run(call):
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        y, h = call(x)
        with torch.set_grad_enabled(grad_mode):
            y.mul_(100.0)
        h.sum().backward()
        return x.grad
    want = run(_reads_its_result_later)
    for _ in range(3):
        got = run(lambda x: bt.checkpoint(_reads_its_result_later, x, num_ckpts=num_ckpts))
        torch.testing.assert_close(got, want, rtol=RTOL, atol=0)


def test_a_saved_result_written_by_the_caller_is_refused_as_autograd_refuses():
    def g(x):
        h = x
        for _ in range(6):
            h = (h * 1.1).sin()
        y = h * 2
        return y, y.sin()           # sin saves y

    for call in (g,) + (lambda x: bt.checkpoint(g, x, num_ckpts=2),) * 3:
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        y, z = call(x)
        with torch.no_grad():
            y.mul_(100.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_a_tensor_whose_data_is_replaced_inside_the_function_is_refused():
    """``y.data = ...`` is no aten op: the replays would compute the old ``y``."""
    def f(x):
        y = x.sin()
        y.data = y.data * 2
        return (y * 1.5).exp()

    x = torch.linspace(-1, 1, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"t\.data = "):
        bt.checkpoint(f, x, num_ckpts=1)


def test_a_resized_intermediate_is_no_replaced_storage():
    """``resize_`` is an op the recorder sees: the storage it moves is the value's own."""
    def f(x):
        y = x.sin()
        z = (x * 3).detach()                # made here, requires no grad
        z.resize_(4096)                     # moves its storage
        z.resize_(2, 4)
        return (z[0] * y).cos()

    x = torch.linspace(-1, 1, 4, requires_grad=True)
    f(x).sum().backward()
    want, x.grad = x.grad, None
    bt.checkpoint(f, x, num_ckpts=1).sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=RTOL, atol=0)


def test_a_checkpointed_module_deep_copies_and_saves_as_its_model_does():
    """An EMA or best-model copy: ``copy.deepcopy`` and ``torch.save`` raised on the plan book's
    lock. A copy shares nothing with the original, plans anew, and is exact."""
    import copy
    import io
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    net = bt.checkpoint_module(model, num_ckpts=2)
    x = torch.randn(3, 4)
    net(x).sum().backward()                 # the original has a plan
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(net), torch.load(buf, weights_only=False)):
        assert [n for n, _ in twin.named_parameters()] == [n for n, _ in net.named_parameters()]
        assert all(a is b for a, b in zip(twin.parameters(), twin.model.parameters()))
        assert not any(a is b for a, b in zip(twin.parameters(), net.parameters()))
        twin.zero_grad()
        twin(x).sum().backward()
        plain = copy.deepcopy(model)
        plain.zero_grad()
        plain(x).sum().backward()
        for a, b in zip(twin.parameters(), plain.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=RTOL, atol=0)


def _tanh_mm(x, w):
    return (x @ w).tanh()


@pytest.mark.parametrize("how", ["vmap", "jvp", "forward_ad", "sparse"])
def test_what_a_replay_cannot_stand_in_for_is_refused_naming_it(how):
    """These crashed deep inside the recorder (``BatchedTensorImpl`` has no storage, an invalid
    python storage), naming neither bincheck nor the cause."""
    import torch.autograd.forward_ad as fwad
    x, w = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)

    def ck(a):
        return bt.checkpoint(_tanh_mm, a, w, num_ckpts=1)
    calls = {"vmap": (lambda: torch.func.vmap(ck)(x.unsqueeze(1)), "torch.func transform"),
             "jvp": (lambda: torch.func.jvp(ck, (x,), (torch.ones_like(x),)), "forward-mode"),
             "sparse": (lambda: ck(x.to_sparse()), "sparse_coo")}
    if how == "forward_ad":
        with fwad.dual_level(), pytest.raises(NotImplementedError, match="forward-mode"):
            ck(fwad.make_dual(x, torch.ones_like(x)))
        return
    call, match = calls[how]
    with pytest.raises(NotImplementedError, match=match):
        call()


def test_a_refused_budget_leaves_buffers_and_the_rng_stream_as_they_were():
    """The budget is refused after the forward ran: BatchNorm had counted a batch and dropout
    had drawn, so a retry with a larger budget updated them twice."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5))
    gen = torch.Generator().manual_seed(3)
    noisy = bt.checkpoint_function(lambda x: model(x) * torch.rand(4, generator=gen),
                                   memory=100)
    x = torch.randn(8, 4, requires_grad=True)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    rng, gen_state = torch.get_rng_state(), gen.get_state()
    with pytest.raises(ValueError, match="below the least"):
        noisy(x)
    for k, v in model.state_dict().items():
        assert torch.equal(v, buffers[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(gen.get_state(), gen_state)


def test_reading_a_saved_tensor_with_grad_mode_on_names_no_grad():
    x = torch.randn(3, requires_grad=True)
    y = bt.checkpoint(lambda t: t.sin().exp(), x, num_ckpts=1)
    with pytest.raises(RuntimeError, match="torch.no_grad"):
        y.grad_fn._saved_result
    with torch.no_grad():
        torch.testing.assert_close(y.grad_fn._saved_result, x.sin().exp(), rtol=RTOL, atol=0)


def test_a_module_writing_into_a_view_of_its_buffer_is_refused_saying_where_it_belongs():
    """InstanceNorm with running statistics writes them through a view: the refusal's advice
    ("write into the tensor itself") could not be followed inside torch's module."""
    norm = torch.nn.InstanceNorm1d(3, track_running_stats=True)
    with pytest.raises(NotImplementedError, match="InstanceNorm .*outside the checkpointed"):
        bt.checkpoint(norm, torch.randn(2, 3, 5, requires_grad=True), num_ckpts=1)


@pytest.mark.parametrize("kw", [dict(num_ckpts=2), dict(memory=10 ** 9)])
def test_an_lstm_in_float32_replays_its_workspace(kw):
    """On the CPU a float32 ``nn.LSTM`` runs ``mkldnn_rnn_layer``, which returns its backward's
    workspace only with grad mode on: replayed under ``no_grad`` it returned none, and the
    backward raised a bare ``KeyError``. Float32 both ways: the same kernels, the same values."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 8, num_layers=2, batch_first=True).float()
    x = torch.randn(3, 5, 4, dtype=torch.float32, requires_grad=True)

    def grads(module):
        x.grad = None
        lstm.zero_grad()
        out, (h, c) = module(x)
        (out.sum() + h.pow(2).sum()).backward()
        return [x.grad] + [p.grad for p in lstm.parameters()]
    want = grads(lstm)
    net = bt.checkpoint_module(lstm, **kw)
    for _ in range(2):
        for a, b in zip(grads(net), want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kw", [dict(num_ckpts=2), dict(memory="2MB")])
def test_a_forward_whose_graph_is_dropped_unused_leaves_nothing_allocated(kw):
    """Evaluation under grad mode, a skipped batch: a repeated call's forward takes snapshots
    and tape whose ``grad_fn`` held the graph, whose saved-tensor hooks held them: a cycle
    through autograd's nodes that ``gc`` cannot collect (1 MB leaked a call here)."""
    import gc
    from tests.torch_helpers import allocation_peak
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 128), *[
        m for _ in range(4) for m in (torch.nn.Linear(128, 128), torch.nn.Tanh())])
    net = bt.checkpoint_module(model, **kw)
    x = torch.randn(128, 8)
    net(x).sum().backward()                 # planned: later forwards take its snapshots

    def dropped():
        for _ in range(3):
            y = net(x)
            del y
        gc.collect()
    _, _, left = allocation_peak(dropped, net=True)
    assert left == 0


def test_a_repeated_call_keeps_no_saved_tensor_of_the_op_before_its_taped_segment():
    """The forward of a repeated call keeps what the plan's first taped segment saves; it also
    kept what the op just before that segment saved (a 2 MiB GELU output, saved by the next
    ``addmm``), unpriced: 1.077x the budget on the second call, 0.834x on the first."""
    from tests.torch_helpers import allocation_peak
    F = torch.nn.functional
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 32), nn.Tanh(), nn.Linear(32, 1024),
        nn.GELU(), nn.Linear(1024, 16), nn.Tanh(),
        *[m for _ in range(6) for m in (nn.Linear(16, 256), nn.SiLU(), nn.Linear(256, 16))],
        nn.Linear(16, 10)).float()
    x = torch.randn(512, 64, dtype=torch.float32)
    t = torch.randint(0, 10, (512,))
    memory = 8_659_470
    net = bt.checkpoint_module(model, memory=memory)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        _, peak = allocation_peak(lambda: F.cross_entropy(net(x), t).backward())
        assert peak <= memory, peak / memory


def test_a_stack_of_every_step_is_priced_once_not_once_per_input():
    """``stack``'s inputs get views of its output's gradient: priced as the whole output for
    each input, a stack of T steps cost T times its output (least budgets 5-37x store-all's
    measured peak, T = 8-64). Twice store-all's peak now plans and holds."""
    import copy
    from tests.torch_helpers import allocation_peak

    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.Linear(64, 64)

        def forward(self, h):
            hs = []
            for _ in range(32):
                h = torch.tanh(self.cell(h))
                hs.append(h)
            return torch.stack(hs, 1)
    torch.manual_seed(0)
    model, x = Loop(), torch.randn(32, 64)
    plain = copy.deepcopy(model)
    _, store_all = allocation_peak(lambda: plain(x).pow(2).sum().backward())
    memory = 2 * store_all
    net = bt.checkpoint_module(model, memory=memory)
    for _ in range(2):
        model.zero_grad()
        _, peak = allocation_peak(lambda: net(x).pow(2).sum().backward())
        assert peak <= memory
        for a, b in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=RTOL, atol=0)


def test_a_checkpointed_module_shows_its_model_s_mode():
    """``model.eval()`` called on the model itself left ``net.training`` True."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    net = bt.checkpoint_module(model, num_ckpts=2)
    model.eval()
    assert net.training is False
    net.train()
    assert model.training and model[1].training and net.training
    net.eval()
    assert not model.training and not model[1].training and not net.training


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_convolution_s_backward_scratch_is_within_the_budget(dtype):
    """A 3x3 convolution's backward holds up to twice its input beside its gradients under
    oneDNN (float32) and 9 times it in im2col columns on the slow path (float64); the model
    allowed one input's size: a probe measured 1.06-1.25x ``memory=``, first and repeated
    calls. At the least budget the refusal names and above it."""
    import re
    from tests.torch_helpers import allocation_peak
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(24, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 4, 3, padding=1)).to(dtype)
    x = torch.randn(4, 3, 32, 32, dtype=dtype)
    with pytest.raises(ValueError) as refused:
        bt.checkpoint_module(model, memory=1)(x)
    least = int(re.search(r"pass memory=(\d+)", str(refused.value)).group(1))
    for memory in (least, int(1.15 * least)):
        net = bt.checkpoint_module(model, memory=memory)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            _, peak = allocation_peak(lambda: net(x).sum().backward())
            assert peak <= memory, (memory / least, peak / memory)


def test_a_backward_inside_the_function_is_refused_naming_it():
    """A gradient penalty inside the checkpointed function raised ``AttributeError`` from the
    saved-tensor hook (no trace yet); the next plain and checkpointed calls still work."""
    w = torch.randn(4, 4, requires_grad=True)

    def penalised(x):
        x = x.detach().requires_grad_()
        y = (x @ w).tanh()
        g, = torch.autograd.grad(y.sum(), x, create_graph=True)
        return y.sum() + g.pow(2).sum()

    with pytest.raises(NotImplementedError, match="gradient penalty"):
        bt.checkpoint(penalised, torch.randn(3, 4), num_ckpts=2)
    x = torch.randn(3, 4, requires_grad=True)
    want, = torch.autograd.grad((x @ w).tanh().sum(), x)
    bt.checkpoint(lambda a: (a @ w).tanh(), x, num_ckpts=2).sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=RTOL, atol=0)


@pytest.mark.parametrize("op", ["logcumsumexp", "cumprod", "scatter_reduce"])
def test_a_backward_with_large_scratch_is_within_the_budget(op):
    """``logcumsumexp``'s backward holds 7 times its tensor beside its gradient, a ``prod``
    ``scatter_reduce``'s 12, ``cumprod``'s 3, all priced at nothing: a probe measured chains of
    them at 1.3-2.6x ``memory=``."""
    import re
    from tests.torch_helpers import allocation_peak
    torch.manual_seed(0)
    idx = torch.randint(0, 32, (2, 16, 32, 32))
    ops = {"logcumsumexp": lambda h: torch.logcumsumexp(h, 3),
           "cumprod": lambda h: torch.cumprod(h * 0.5 + 1, 3),
           "scatter_reduce": lambda h: h.scatter_reduce(3, idx, h * 2, "prod")}

    def f(x):
        h = x
        for _ in range(4):
            h = ops[op](h).tanh()
        return h
    x = torch.randn(2, 16, 32, 32, requires_grad=True)
    with pytest.raises(ValueError) as refused:
        bt.checkpoint(f, x, memory=1)
    memory = int(re.search(r"pass memory=(\d+)", str(refused.value)).group(1))
    for _ in range(2):
        _, peak = allocation_peak(lambda: bt.checkpoint(f, x, memory=memory).sum().backward())
        assert peak <= memory, peak / memory


def test_a_result_dropped_and_written_through_an_alias_leaves_the_gradient_exact():
    """The result's version is checked through a weak reference: dropped (``a = a.detach()``),
    its storage written through the alias went unseen by a repeated call's snapshots."""
    def run(call):
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        a, h = call(x)
        a = a.detach()
        a.zero_()
        h.sum().backward()
        return x.grad
    want = run(_reads_its_result_later)
    for _ in range(3):
        got = run(lambda x: bt.checkpoint(_reads_its_result_later, x, num_ckpts=2))
        torch.testing.assert_close(got, want, rtol=RTOL, atol=0)


def test_a_refusal_during_the_forward_leaves_buffers_as_they_were():
    """Refused mid-forward (``t.data = ...`` here), BatchNorm had already counted a batch."""
    norm = torch.nn.BatchNorm1d(4)

    def f(x):
        y = norm(x)
        y.data = y.data * 2
        return y * 3
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    with pytest.raises(NotImplementedError, match=r"t\.data"):
        bt.checkpoint(f, torch.randn(8, 4, requires_grad=True), num_ckpts=1)
    for k, v in norm.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_convolutions_under_cpu_autocast_are_priced_by_their_cast_weights():
    """Under CPU autocast a convolution's weight is a bfloat16 copy made in the function, and
    its backward's scratch went unpriced: 1.29x ``memory=`` at 1.3x the least budget (1.65x at
    the least). Still 1.12x at the least budget itself: see the CHANGELOG."""
    import re
    from tests.torch_helpers import allocation_peak
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(24, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 4, 3, padding=1)).float()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float32)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float()
    with pytest.raises(ValueError) as refused:
        bt.checkpoint(f, x, memory=1)
    memory = int(1.3 * int(re.search(r"pass memory=(\d+)", str(refused.value)).group(1)))
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        _, peak = allocation_peak(lambda: bt.checkpoint(f, x, memory=memory).sum().backward())
        assert peak <= memory, peak / memory

"""bincheck.torch's errors name the argument, the value and the rule."""

import pytest

torch = pytest.importorskip("torch")
import bincheck.torch as bt  # noqa: E402
from torch_helpers import problem, requiring, tanh_cell  # noqa: E402

T = 8


@pytest.fixture
def args():
    params, h0, xs = problem(T)
    return tuple(requiring(*params)), h0, xs


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_ckpts=0), "num_ckpts must be a positive int"),
    (dict(num_ckpts=True), "num_ckpts must be a positive int"),
    (dict(num_ckpts=3, memory="1MB"), "give exactly one of num_ckpts"),
    (dict(), "give exactly one of num_ckpts"),
    (dict(memory="lots"), "memory must be a number of bytes"),
    (dict(num_ckpts=3, verify="yes"), "verify must be a bool"),
    (dict(num_ckpts=3, preserve_rng_state=1), "preserve_rng_state must be a bool"),
    (dict(num_ckpts=3, output_fn=4), "output_fn must be callable"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        bt.binomial_checkpoint(tanh_cell, T, **kwargs)


def test_inputs_of_the_wrong_length(args):
    params, h0, xs = args
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    with pytest.raises(ValueError, match=r"leading length seq_len=8 .* got leading length 7"):
        loop(params, h0, xs[:7])
    with pytest.raises(ValueError, match="pass torch.stack"):
        loop(params, h0, list(xs))


def test_state_must_keep_its_shape_and_dtype(args):
    params, h0, xs = args
    grow = bt.binomial_checkpoint(lambda p, h, x: torch.cat([tanh_cell(p, h, x), h], 1), T, 3)
    with pytest.raises(ValueError, match=r"at step 0 state leaf 0 was shape \(3, 4\)"):
        grow(params, h0, xs)
    cast = bt.binomial_checkpoint(lambda p, h, x: tanh_cell(p, h, x).float(), T, 3)
    with pytest.raises(ValueError, match="torch.float64.* returned shape .*torch.float32"):
        cast(params, h0, xs).sum().backward()
    tup = bt.binomial_checkpoint(lambda p, h, x: (tanh_cell(p, h, x),), T, 3)
    with pytest.raises(ValueError, match="structure of its input state"):
        tup(params, h0, xs)


def test_state_leaves_must_be_tensors(args):
    params, h0, xs = args
    with pytest.raises(TypeError, match="init_state must be a tensor"):
        bt.binomial_checkpoint(tanh_cell, T, 3)(params, (h0, 1.0), xs)


def test_while_loop_arguments(args):
    params, h0, _ = args
    with pytest.raises(TypeError, match="cond_fn must be callable"):
        bt.checkpointed_while_loop(None, lambda p, h: h, 3)
    with pytest.raises(ValueError, match="max_steps must be a non-negative int"):
        bt.checkpointed_while_loop(lambda p, h: True, lambda p, h: h, 3, max_steps=-1)
    run = bt.checkpointed_while_loop(lambda p, h: True, lambda p, h: h * p[0][0, 0], 3,
                                     max_steps=5)
    with pytest.raises(RuntimeError, match="still true after max_steps=5"):
        run(params, h0)
    bad = bt.checkpointed_while_loop(lambda p, h: h, lambda p, h: h, 3)
    with pytest.raises(TypeError, match="cond_fn must return a bool"):
        bad(params, h0)


def test_loops_are_configured_once():
    loop = bt.binomial_checkpoint(tanh_cell, T, 3)
    with pytest.raises(AttributeError, match="configured once"):
        loop.fn = tanh_cell


def test_offload_needs_a_memory_budget():
    with pytest.raises(TypeError, match="offload=True needs memory="):
        bt.binomial_checkpoint(tanh_cell, T, 3, offload=True)

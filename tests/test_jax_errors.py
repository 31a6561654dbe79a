"""bincheck.jax's errors name the argument, the value and the rule, and come before anything
runs (at trace time, from shapes)."""

import re

import pytest

from jax_helpers import Counter, jax, problem, tanh_cell  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bincheck  # noqa: E402
import bincheck.jax as bj  # noqa: E402

T = 8


@pytest.fixture
def args():
    return problem(T)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(num_ckpts=0), ValueError, r"num_ckpts must be a positive int .*got 0"),
    (dict(num_ckpts=-2), ValueError, r"num_ckpts must be a positive int .*got -2"),
    (dict(num_ckpts=True), TypeError, r"num_ckpts must be a positive int .*got True"),
    (dict(num_ckpts=2.0), TypeError, r"num_ckpts must be a positive int .*got 2.0 of type float"),
    (dict(num_ckpts=3, memory="1MB"), TypeError, "give exactly one of num_ckpts .* and memory"),
    (dict(), TypeError, "give exactly one of num_ckpts .* and memory"),
    (dict(memory="lots"), ValueError, "memory must be a number of bytes .*got 'lots'"),
    (dict(memory=0), ValueError, "memory must be at least 1 byte; got 0"),
    (dict(memory=[1]), TypeError, "memory must be a number of bytes"),
    (dict(num_ckpts=3, output_fn=4), TypeError, "output_fn must be callable"),
])
def test_bad_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        bj.binomial_checkpoint(tanh_cell, T, **kwargs)


def test_bad_length_and_step():
    with pytest.raises(ValueError, match="seq_len must be a positive int; got 0"):
        bj.binomial_checkpoint(tanh_cell, 0, 3)
    with pytest.raises(TypeError, match="fn must be callable as fn.params, state, x."):
        bj.binomial_checkpoint(None, T, 3)


def test_errors_match_the_autograd_front_end():
    """The same validators as bincheck.binomial_checkpoint: the same messages."""
    pytest.importorskip("autograd")
    for kwargs in (dict(num_ckpts=0), dict(num_ckpts=3, memory="1MB"), dict(memory="lots")):
        messages = []
        for make in (bj.binomial_checkpoint, bincheck.binomial_checkpoint):
            with pytest.raises((TypeError, ValueError)) as err:
                make(tanh_cell, T, **kwargs)
            messages.append((type(err.value), str(err.value)))
        assert messages[0] == messages[1]


def test_inputs_of_the_wrong_length(args):
    params, h0, xs = args
    loop = bj.binomial_checkpoint(tanh_cell, T, 3)
    with pytest.raises(ValueError, match=r"leading length seq_len=8 .*got a leaf of shape "
                                         r"\(7, 3, 2\)"):
        loop(params, h0, xs[:7])
    with pytest.raises(ValueError, match=r"seq_len=8 .*shape \(\).*'b'"):
        loop(params, h0, {"a": xs, "b": jnp.ones(())})
    with pytest.raises(ValueError, match=r"seq_len=8 .*shape \(7, 3, 2\)"):   # under jit too
        jax.jit(loop)(params, h0, xs[:7])
    with pytest.raises(ValueError, match=r"^xs: .*leading length length=5 .*shape \(8, 3, 2\)"):
        bj.scan(lambda c, x: (c, x), h0, xs, length=5, num_ckpts=2)     # the names scan takes


def test_step_must_keep_the_state_shape_dtype_and_structure(args):
    params, h0, xs = args
    grow = bj.binomial_checkpoint(lambda p, h, x: jnp.concatenate([h, h], 1), T, 3)
    with pytest.raises(ValueError, match=r"keep their shapes and dtypes .* leaf 0 went from "
                                         r"float64\[3, 4\] to float64\[3, 8\]"):
        grow(params, h0, xs)
    cast = bj.binomial_checkpoint(lambda p, h, x: tanh_cell(p, h, x).astype(jnp.float32), T, 3)
    with pytest.raises(ValueError, match=r"float64\[3, 4\] to float32\[3, 4\]"):
        jax.jit(jax.grad(lambda p: jnp.sum(cast(p, h0, xs))))(params)
    tup = bj.binomial_checkpoint(lambda p, h, x: (tanh_cell(p, h, x),), T, 3)
    with pytest.raises(ValueError, match="structure of init_state"):
        tup(params, h0, xs)
    drop = bj.binomial_checkpoint(lambda p, s, x: {"h": s["h"]}, T, 3)
    with pytest.raises(ValueError, match="structure of init_state"):
        drop(params, {"h": h0, "c": h0}, xs)


@pytest.mark.parametrize("step", [lambda p, h, x: tanh_cell(p, h, x),
                                  lambda p, h, x: h * x[0],
                                  lambda p, h, x: jnp.tanh(h + x)],
                         ids=["matmul", "index", "add"])
def test_inputs_none_with_a_step_that_uses_x(args, step):
    params, h0, _ = args
    loop = bj.binomial_checkpoint(step, T, 3)
    with pytest.raises(TypeError, match=r"fn failed with x=None: .*inputs is None, so each step "
                                        r"gets x=None; pass inputs=\.\.\."):
        loop(params, h0, None)


def test_scan_errors_use_scans_names(args):
    _, h0, _ = args
    with pytest.raises(TypeError, match=r"^f failed with x=None: .*xs is None, so each step gets "
                                        r"x=None; pass xs=\.\.\. with a leading axis of "
                                        r"length length"):
        bj.scan(lambda c, x: (c * x, 0.0), h0, None, length=5, num_ckpts=2)


def test_preview_takes_shapes(args):
    """preview plans from jax.ShapeDtypeStruct trees, without arrays."""
    params, h0, xs = args
    S = lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype)    # noqa: E731
    loop = bj.binomial_checkpoint(tanh_cell, T, memory="1MB")
    from_shapes = loop.preview(jax.tree.map(S, params), S(h0), S(xs))
    assert from_shapes.sizes == loop.preview(params, h0, xs).sizes
    assert from_shapes.sizes.state_bytes == h0.size * h0.dtype.itemsize


def test_scan_arguments(args):
    _, h0, xs = args
    with pytest.raises(ValueError, match="scan needs xs with a leading axis or length="):
        bj.scan(lambda c, x: (c, x), h0, None, num_ckpts=2)
    with pytest.raises(ValueError, match="length must be a non-negative int; got -1"):
        bj.scan(lambda c, x: (c, x), h0, None, length=-1, num_ckpts=2)
    with pytest.raises(TypeError, match="give exactly one of num_ckpts"):
        bj.scan(lambda c, x: (c, x), h0, xs)
    with pytest.raises(TypeError, match="f must be callable"):
        bj.scan(None, h0, xs, num_ckpts=2)


def test_a_budget_below_the_minimum_names_it_before_anything_runs(args):
    params, h0, xs = args
    counter = Counter()
    cell = counter.wrap(tanh_cell)
    loop = bj.binomial_checkpoint(cell, T, memory=100)
    for run in (loop, jax.jit(jax.grad(lambda p, h, x: jnp.sum(loop(p, h, x))))):
        with pytest.raises(ValueError, match=r"memory=100 bytes is below the least this loop "
                                             r"needs: one stored state \(96 bytes\)") as err:
            run(params, h0, xs)
    assert counter.settled()["fn"] == 0                 # no step ran
    minimum = int(re.search(r"(\d+) bytes in all", str(err.value)).group(1))
    assert minimum > 96
    with pytest.raises(ValueError, match=f"{minimum} bytes in all"):
        bj.binomial_checkpoint(cell, T, memory=minimum - 1).preview(params, h0, xs)
    # the minimum itself is enough: one stored state, recomputing from it
    ok = bj.binomial_checkpoint(cell, T, memory=minimum)
    assert ok.preview(params, h0, xs).schedule.num_ckpts == 1
    jax.block_until_ready(jax.grad(lambda p: jnp.sum(ok(p, h0, xs)))(params))
    assert counter.settled()["fn"] == T * (T - 1) // 2 + T


def test_loops_are_configured_once():
    loop = bj.binomial_checkpoint(tanh_cell, T, 3)
    with pytest.raises(AttributeError, match="configured once"):
        loop.fn = tanh_cell

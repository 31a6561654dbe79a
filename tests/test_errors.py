"""Bad input fails early with a TypeError/ValueError naming the argument, the value and the rule."""

import autograd.numpy as np
import numpy
import pytest
from autograd import grad

from bincheck import (Advance, CheckpointedLoop, Free, Reverse, ScheduleError, Snapshot,
                      binomial_checkpoint, checkpointed_while_loop, simulate)
from helpers import Counter, rnn_problem, tanh_rnn


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match=r"fn must be callable.*got 3"):
        binomial_checkpoint(3, 10, 2)


@pytest.mark.parametrize("name,kwargs", [("seq_len", {"seq_len": 0}), ("seq_len", {"seq_len": 2.0}),
                                         ("seq_len", {"seq_len": True}),
                                         ("num_ckpts", {"num_ckpts": -1}),
                                         ("num_ckpts", {"num_ckpts": 3.5}),
                                         ("num_ckpts", {"num_ckpts": False})])
def test_lengths_must_be_positive_ints(name, kwargs):
    args = {"seq_len": 10, "num_ckpts": 2, **kwargs}
    with pytest.raises((TypeError, ValueError), match=rf"{name} must be a positive int.*got "
                                                      rf"{kwargs[name]!r}"):
        binomial_checkpoint(tanh_rnn, **args)


def test_bool_rejected_as_type_error():
    with pytest.raises(TypeError):
        binomial_checkpoint(tanh_rnn, True, 2)
    with pytest.raises(TypeError, match="with_outputs"):
        binomial_checkpoint(tanh_rnn, 4, 2, with_outputs="yes")


@pytest.mark.parametrize("differentiate", [False, True])
def test_inputs_length_must_match(differentiate):
    params, h0, xs = rnn_problem(7)
    cell = Counter(tanh_rnn)
    loop = binomial_checkpoint(cell, 9, 2)
    run = (lambda: grad(lambda p: np.sum(loop(p, h0, xs)))(params)) if differentiate else \
        (lambda: loop(params, h0, xs))
    with pytest.raises(ValueError, match=r"inputs.*seq_len=9.*7"):
        run()
    assert cell.calls == 0                       # raised before any work


def test_inputs_leaf_in_a_tree_checked_too():
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(lambda p, h, x: tanh_rnn(p, h, x[0]) + x[1], 5, 2)
    with pytest.raises(ValueError, match=r"seq_len=5.*a scalar"):
        loop(params, h0, (xs, 1.0))


def test_with_outputs_requires_a_pair():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(tanh_rnn, 4, 2, with_outputs=True)
    for run in (lambda: loop(params, h0, xs), lambda: grad(lambda p: np.sum(loop(p, h0, xs)[0]))(params)):
        with pytest.raises(TypeError, match=r"with_outputs=True.*2-tuple.*step 0"):
            run()


def test_state_structure_must_be_preserved():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(lambda p, st, x: (tanh_rnn(p, st[0], x),), 4, 2)
    with pytest.raises(ValueError, match=r"structure.*step 0.*\(leaf, leaf\).*\(leaf,\)"):
        grad(lambda h: np.sum(loop(params, (h, h), xs)[0]))(h0)


def test_state_shape_must_be_preserved():
    params, h0, xs = rnn_problem(4)
    loop = binomial_checkpoint(tanh_rnn, 4, 2)
    with pytest.raises(ValueError, match=r"shapes.*step 0.*\(4,\).*\(2, 4\)"):
        grad(lambda p: np.sum(loop(p, h0[0], xs)))(params)   # (4,) state broadcasts to (2, 4)


def test_shape_change_late_in_the_loop_is_caught():
    params, h0, xs = rnn_problem(6)
    bad = lambda p, h, x: tanh_rnn(p, h, x)[:1] if numpy.all(x == xs[3]) else tanh_rnn(p, h, x)
    loop = binomial_checkpoint(bad, 6, 2)
    with pytest.raises(ValueError, match=r"step 3"):
        loop(params, h0, xs)


@pytest.mark.parametrize("bad", [[Snapshot(0), Reverse(0, 1), Free(0)], None,
                                 (a for a in [Snapshot(0)]), 3])
def test_simulate_says_what_it_accepts(bad):
    with pytest.raises(TypeError, match=r"simulate\(\) takes a schedule .*seq_len"):
        simulate(bad)


def test_simulate_accepts_a_list_with_its_length():
    assert simulate([Snapshot(0), Reverse(0, 1), Free(0)], 1).taped_steps == 1
    with pytest.raises(ScheduleError, match=r"unknown action 'advance' of type str"):
        simulate(["advance"], 1)


class NoReverse:
    """A custom schedule that forgets to reverse."""
    seq_len, first_reverse_start, plain_steps = 3, 2, 2

    def __iter__(self):
        yield Snapshot(0)
        yield Advance(0, 2)


def test_custom_schedule_without_reverse_is_a_schedule_error():
    params, h0, xs = rnn_problem(3)
    loop = CheckpointedLoop(tanh_rnn, NoReverse())
    with pytest.raises(ScheduleError, match=r"yielded no Reverse action"):
        grad(lambda p: np.sum(loop(p, h0, xs)))(params)


def test_list_of_per_step_inputs_suggests_stack():
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(tanh_rnn, 5, 2)
    with pytest.raises(ValueError, match=r"list of 5 items.*numpy\.stack\(inputs\)"):
        loop(params, h0, list(xs))


def test_numpy_integers_and_bools_are_accepted():
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(tanh_rnn, numpy.int64(5), numpy.int32(2),
                               with_outputs=numpy.bool_(False), verify=numpy.bool_(True))
    assert loop.verify is True and loop.with_outputs is False and loop.seq_len == 5
    grad(lambda p: np.sum(loop(p, h0, xs)))(params)
    run = checkpointed_while_loop(lambda p, x: x < 10.0, lambda p, x: x + p, numpy.int64(2),
                                  max_steps=numpy.int64(5), verify=numpy.bool_(False))
    assert run(4.0, 0.0) == 12.0 and run.max_steps == 5 and type(run.max_steps) is int


@pytest.mark.parametrize("bad", [numpy.float64(2.0), numpy.bool_(True)])
def test_numpy_floats_and_bools_are_not_lengths(bad):
    with pytest.raises(TypeError, match="seq_len must be a positive int"):
        binomial_checkpoint(tanh_rnn, bad, 2)
    with pytest.raises(TypeError, match="verify must be a bool"):
        binomial_checkpoint(tanh_rnn, 3, 2, verify=numpy.int64(1))


def test_long_arguments_are_not_echoed_in_full():
    with pytest.raises(TypeError) as info:
        binomial_checkpoint(tanh_rnn, "7" * 10_000, 2)
    assert len(str(info.value)) < 300


def test_planner_factory_must_return_a_planner():
    from bincheck import WhileLoop
    run = WhileLoop(lambda p, s: s < 3, lambda p, s: s + 1, 2, planner=lambda n: object())
    with pytest.raises(TypeError, match=r"planner\(num_ckpts\) must return an online planner"):
        grad(lambda p: run(p, 0.0))(1.0)


def test_budget_arguments_are_checked_up_front(tmp_path):
    # a budget larger than any machine means "every state fits": accepted, as the number is
    assert binomial_checkpoint(tanh_rnn, 5, memory="9" * 400 + " B").schedule.memory == 10**400 - 1
    with pytest.raises(FileNotFoundError, match="no-such-dir.*no such directory"):
        binomial_checkpoint(tanh_rnn, 5, memory="1MB", disk=str(tmp_path / "no-such-dir"))
    with pytest.raises(TypeError, match="max_relative_time must be a number"):
        from bincheck import Sizes, memory_for
        memory_for(10, "a", Sizes(8, None, 0, 1e-3, 1e-3))


@pytest.mark.parametrize("budget", [{"num_ckpts": 2}, {"memory": "1MB"}])
def test_forgotten_inputs_are_named_in_the_error(budget):
    """Forgetting inputs gave "unsupported operand type(s) for *: 'NoneType' and 'float'" with no
    hint that x was None."""
    params, h0, xs = rnn_problem(5)
    loop = binomial_checkpoint(tanh_rnn, 5, **budget)
    for call in (lambda: loop(params, h0), lambda: grad(lambda p: np.sum(loop(p, h0)))(params)):
        with pytest.raises(TypeError, match=r"NoneType.*x was None.*inputs=None.*pass inputs"):
            call()
    # a None error that is not about x (a while loop's body gets no x) is left alone
    run = checkpointed_while_loop(lambda p, s: s < 3, lambda p, s: None * s, num_ckpts=2)
    with pytest.raises(TypeError) as info:
        run(1.0, 0.0)
    assert "inputs" not in str(info.value)


def test_a_taped_step_that_changes_the_state_shape_is_refused():
    """Under a budget that tapes the whole loop, no plain step sees step 5: the taped path checks
    shapes too (issue 17, point 3)."""
    import autograd.numpy as anp
    from autograd import grad
    from bincheck import binomial_checkpoint

    def step(p, h, x):
        return anp.concatenate([h, h[:1]]) * p if x[0] == 5 else anp.tanh(h * p)
    xs = numpy.arange(10.0)[:, None]
    loop = binomial_checkpoint(step, 10, memory="10MB")
    with pytest.raises(ValueError, match=r"step 5 got shapes \[\(3,\)\] and returned \[\(4,\)\]"):
        grad(lambda p: anp.sum(loop(p, numpy.ones(3), xs)))(0.5)


@pytest.mark.parametrize("at", [5, 9])
def test_a_taped_step_that_changes_the_state_structure_is_refused(at):
    """Under a budget that tapes the whole loop, a step that returned a tuple for a one-array
    state went on into the next step (a TypeError deep in autograd) or, as the last step, raised
    an InternalError blaming bincheck. Now the step is refused as a plain step would be (issue
    17, point 3: structure checks run whatever the planner chose)."""
    import autograd.numpy as anp
    from autograd import grad
    from bincheck import binomial_checkpoint

    def step(p, h, x):
        return (anp.tanh(h * p), h) if x[0] == at else anp.tanh(h * p)
    xs = numpy.arange(10.0)[:, None]
    loop = binomial_checkpoint(step, 10, memory="10MB")
    with pytest.raises(ValueError, match=rf"state with the structure of its input state; taped "
                                         rf"step {at} got leaf and returned \(leaf, leaf\)"):
        grad(lambda p: anp.sum(loop(p, numpy.ones(3), xs)))(0.5)

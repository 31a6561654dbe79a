"""One validity test over every planner: each stream, replayed through the tracker, reverses every
step exactly once in order, stays within its budget, ends with nothing stored, and costs what the
planner predicts."""

import pytest

from bincheck.schedule import EqualSegments, plan, simulate
from bincheck.schedule.online import EveryKPlanner, OnlinePlanner
from helpers import closed_form, drive_online


def offline(make):
    def run(l, budget):
        schedule = make(l, budget)
        cost = simulate(schedule)
        return cost.reversed, cost.peak_checkpoints, cost.plain_steps, schedule.plain_steps, \
            cost.taped_steps
    return run


def online(make, predicted_extra):
    def run(l, budget):
        planner = make(budget)
        tracker, _ = drive_online(planner, l)
        predicted = (l - 1) + planner.predicted_reverse_steps(l) if predicted_extra else \
            tracker.plain_steps
        return tracker.reversed, tracker.peak_checkpoints, tracker.plain_steps, predicted, \
            tracker.taped_steps
    return run


PLANNERS = {
    "binomial": (offline(plan), lambda l, b: b),
    "equal-segments": (offline(EqualSegments), lambda l, b: b),
    "online": (online(OnlinePlanner, True), lambda l, b: b),
    # EveryK stores one state per k steps: its budget is the number of segments
    "every-k": (online(EveryKPlanner, False), lambda l, k: -(-l // k)),
}


@pytest.mark.parametrize("name", PLANNERS)
@pytest.mark.parametrize("l", [1, 2, 3, 7, 20, 57])
@pytest.mark.parametrize("budget", [1, 2, 3, 5, 30])
def test_every_planner_is_valid(name, l, budget):
    run, bound = PLANNERS[name]
    reversed_, peak, plain, predicted, taped = run(l, budget)
    assert reversed_ == list(range(l - 1, -1, -1))
    assert taped == l
    assert peak <= bound(l, budget)
    assert plain == predicted
    if name == "binomial":
        assert plain == closed_form(l, budget)

"""Work forked beside the solve comes back as sent, is shared with the parent task by
task, is cut off at its deadline, and reports a failure instead of hanging."""

from __future__ import annotations

import time

import pytest

from autoshard.search.background import GRACE_S, Background, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs fork and a second core")


def test_every_item_comes_back_in_order_and_the_child_is_gone():
    job = Background.start(lambda claim: iter([{"plan": {"x": [1.5, 2]}, "spent": 0.25}, {"n": None}]))
    items, complete = job.collect(until=time.perf_counter() + 30)
    assert complete and items == [{"plan": {"x": [1.5, 2]}, "spent": 0.25}, {"n": None}]
    assert not job._process.is_alive()


def test_a_child_that_raises_reports_an_incomplete_result():
    def produce(claim):
        yield {"first": 1}
        raise RuntimeError("boom")

    items, complete = Background.start(produce).collect(until=time.perf_counter() + 30)
    assert items == [{"first": 1}] and not complete


def test_a_child_past_its_deadline_is_stopped_with_what_it_sent():
    def produce(claim):
        yield {"first": 1}
        time.sleep(60)
        yield {"never": 1}

    job = Background.start(produce)
    t0 = time.perf_counter()
    items, complete = job.collect(until=t0)
    assert items == [{"first": 1}] and not complete
    assert time.perf_counter() - t0 < GRACE_S + 5 and not job._process.is_alive()


def test_the_child_and_the_parent_share_the_tasks_each_run_once():
    def produce(claim):  # first to last, slowly: the parent takes the last ones meanwhile
        for task in range(8):
            if not claim(task):
                break
            time.sleep(0.2)
            yield {"task": task}

    job = Background.start(produce, tasks=8)
    mine = []
    for task in reversed(range(8)):
        if not job.claim(task):
            break
        time.sleep(0.4)
        mine.append(task)
    items, complete = job.collect(until=time.perf_counter() + 30)
    theirs = [item["task"] for item in items]
    assert complete and theirs and mine
    assert sorted(theirs + mine) == list(range(8))  # every task once: none lost, none run twice
    assert theirs == list(range(len(theirs)))  # the child's are a prefix, the parent's the rest


def test_layouts_priced_beside_the_search_give_the_plan_priced_after_it(monkeypatch):
    import autoshard.search.background as background
    import autoshard.search.portfolio as portfolio
    import autoshard.search.solve as solve
    from examples.models import mlp

    prep = solve.prepare(*mlp.tiny(device="meta"), (2,), profile="h100-sxm-80gb")
    monkeypatch.setattr(portfolio, "BACKGROUND_MIN_NODES", 0)
    here = []  # calls in this process (the child's are made in the child): shared, or all baselines here
    priced = portfolio.baseline_candidates
    monkeypatch.setattr(portfolio, "baseline_candidates", lambda *a, **k: here.append("claim" in k) or priced(*a, **k))
    beside = solve.solve_prepared(prep, time_limit=60)
    assert here == [True]  # only the baselines the child had not started
    assert beside.solver.timings.get("portfolio_s", 0) > 0  # the baselines were priced
    monkeypatch.setattr(background, "can_fork", lambda: False)
    after = solve.solve_prepared(prep, time_limit=60)
    assert here == [True, False]
    assert beside.estimate == after.estimate and beside.nodes == after.nodes and beside.params == after.params
    assert beside.options.get("portfolio") == after.options.get("portfolio")


def test_layouts_a_failing_child_did_not_send_are_priced_in_the_parent(monkeypatch):
    import autoshard.search.background as background
    import autoshard.search.portfolio as portfolio
    import autoshard.search.solve as solve
    from examples.models import mlp

    prep = solve.prepare(*mlp.tiny(device="meta"), (2,), profile="h100-sxm-80gb")
    monkeypatch.setattr(portfolio, "BACKGROUND_MIN_NODES", 0)
    start = background.Background.start

    def first_then_fail(produce, tasks=0):
        def failing(claim):
            for item in produce(lambda n: n == 0 and claim(n)):  # the first baseline only, then an error
                yield item
            raise RuntimeError("the child broke")
        return start(failing, tasks)

    monkeypatch.setattr(background.Background, "start", staticmethod(first_then_fail))
    monkeypatch.setattr(background.Background, "claim", lambda self, n: False)  # the parent helps with none
    here = []  # the baselines priced in this process
    priced = portfolio.baseline_candidates

    def counted(*args, **kwargs):
        for found in priced(*args, **kwargs):
            here.append(found[0])
            yield found

    monkeypatch.setattr(portfolio, "baseline_candidates", counted)
    broken = solve.solve_prepared(prep, time_limit=60)
    beside = list(here)
    here.clear()
    monkeypatch.setattr(background, "can_fork", lambda: False)
    after = solve.solve_prepared(prep, time_limit=60)
    assert len(here) >= 2 and 0 not in beside and sorted(beside + [0]) == here  # the child's first, the rest here
    assert broken.estimate == after.estimate and broken.nodes == after.nodes
    assert broken.options.get("portfolio") == after.options.get("portfolio")


def test_the_module_example_holds():
    import doctest

    import autoshard.search.background as background

    result = doctest.testmod(background)
    assert result.attempted > 0 and result.failed == 0

"""No plan is returned whose replayed caching-allocator reservation exceeds the device
(``autoshard.search.solve._fit_reservation``), unless the user accepts it.

The fixture: an MLP (512 -> 2048 -> 512, batch 64) on 4 ranks priced with a copy of the
H100 profile whose device holds 82 MiB and no allocator headroom (the memory limit is the
device). Keeping everything replicated peaks at 80.3 MiB live, which fits, but the allocator
reserves 84 MiB for it (its 20 MiB segments): over the device.
"""

from __future__ import annotations

import dataclasses

import pytest

from examples.models import mlp
from hw_profiles import load

from autoshard.search.solve import InfeasibleMemoryError, prepare, solve_prepared

MIB = 2**20
DEVICE_BYTES = 82 * MIB


@pytest.fixture(scope="module")
def prep():
    h100 = load("h100-sxm-80gb")
    small = dataclasses.replace(h100, device=dataclasses.replace(h100.device, memory_bytes=DEVICE_BYTES,
                                                                  allocator_headroom=0.0))
    return prepare(*mlp.tiny(device="meta", dim=512, hidden_dim=2048, batch_size=64), (4,), profile=small,
                   time_limit=20)


def test_the_first_plan_fits_live_but_not_reserved(prep) -> None:
    """What the user accepts with allow_over_reservation: the plan of the first solve, as before."""
    plan = solve_prepared(prep, time_limit=20, allow_over_reservation=True)
    assert plan.estimate.peak_memory_bytes <= DEVICE_BYTES < plan.estimate.reserved_bytes
    assert plan.options["allow_over_reservation"] is True and "reservation_rounds" not in plan.options


def test_a_plan_over_the_device_once_reserved_is_solved_again_under_a_lower_limit(prep) -> None:
    over = solve_prepared(prep, time_limit=20, allow_over_reservation=True)
    plan = solve_prepared(prep, time_limit=20)
    assert plan.estimate.reserved_bytes <= DEVICE_BYTES
    assert plan.options["reservation_rounds"] >= 1
    # the re-solve's limit went below the first plan's live peak by at least its overshoot
    overshoot = over.estimate.reserved_bytes - DEVICE_BYTES
    assert plan.estimate.memory_limit_bytes <= over.estimate.peak_memory_bytes - overshoot
    assert plan.estimate.peak_memory_bytes <= plan.estimate.memory_limit_bytes


def test_no_plan_fitting_once_reserved_is_the_infeasible_memory_error(prep) -> None:
    """Every parameter pinned replicated: no lower limit has a plan, so the error of an infeasible
    limit, naming the reservation and the option that accepts it."""
    with pytest.raises(InfeasibleMemoryError, match="reservation is counted.*allow_over_reservation"):
        solve_prepared(prep, time_limit=20, pins={"*": "R"})
    plan = solve_prepared(prep, time_limit=20, pins={"*": "R"}, allow_over_reservation=True)
    assert plan.estimate.reserved_bytes > DEVICE_BYTES


def test_no_memory_limit_asks_for_no_fit(prep) -> None:
    """Without a limit (the baselines' comparison rows) nothing is solved again."""
    plan = solve_prepared(prep, time_limit=20, memory_limit=float("inf"))
    assert plan.estimate.reserved_bytes > DEVICE_BYTES

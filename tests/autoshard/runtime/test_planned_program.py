"""The step program the planner prices is the one the runtime runs, by construction.

The planner builds the program of a solved plan from the assembled graph and the
solver's choice (``autoshard.assembly.step_program``); the runtime builds it from
its fx graph (``autoshard.runtime.binding.PlanBinding.program_nodes``). For the
same plan both must give the same actions and the same lifetimes: FSDP with
gather and gradient buckets, tensor parallel with full recomputation, and a llama
(multi-output ops and their tuple accesses) with selective recomputation.
"""

from __future__ import annotations

import pytest
from threadcomm import run_threads

from autoshard.assembly.assemble import StepPricing
from autoshard.program.actions import Compute, Issue, Recompute
from autoshard.runtime.execute import JointRunner
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3, mlp

CASES = {
    "mlp-fsdp": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="fsdp", recompute="none")),
    "mlp-fsdp+tp-full": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="fsdp+tp", recompute="full")),
    "llama-ddp-selective": (lambda: llama3.tiny(batch_size=2, seq_len=16), (2,),
                            dict(baseline="ddp", recompute="selective")),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def planned(request):
    """(traced, mesh, plan, the programs the planner priced) of one solved case."""
    make, mesh, options = CASES[request.param]
    model, inputs = make()
    prep = prepare(model, inputs, mesh, ("dp", "tp")[:len(mesh)], profile="cpu-gloo")
    built = []
    program = StepPricing.program
    patch = pytest.MonkeyPatch()

    def recording(self, schedule, redistributions, gathers=()):
        out = program(self, schedule, redistributions, gathers)
        built.append(out)
        return out

    patch.setattr(StepPricing, "program", recording)
    try:
        plan = solve_prepared(prep, time_limit=10, **options)
    finally:
        patch.undo()
    return request.param, prep.traced, mesh, plan, built


def test_the_planner_prices_the_program_the_runtime_runs(planned):
    name, traced, mesh, plan, built = planned
    priced = [p for p in built if p.schedule == plan.schedule]
    assert priced, "the planner priced no program of the plan's schedule"
    planner = priced[-1]
    programs = run_threads(mesh, lambda coord, comm: JointRunner(traced, plan, mesh, coord, comm=comm,
                                                                 graph=False).program)
    for runtime in programs.values():
        assert planner.actions == runtime.actions
        assert planner.lifetimes == runtime.lifetimes
        assert planner.phases == runtime.phases and planner.positions == runtime.positions
    # what the pricing reads (the issue order, found without making the actions) is the actions' own
    assert planner.issued() == [a.item for a in planner.actions if isinstance(a, Issue)]
    assert any(isinstance(a, Compute) and "[" in a.node for a in planner.actions) == name.startswith("llama")
    assert any(isinstance(a, Recompute) for a in planner.actions) == (CASES[name][2]["recompute"] != "none")
    assert any(isinstance(a, Issue) for a in planner.actions) == (mesh != (1,))

"""The runtime on 8 real processes: gloo ranks on loopback, meshes (2, 2, 2) and (2, 4).

One spawn of 8 ranks runs every job below (both meshes live in the same job)
and the tests read its results. For each job, after one step through
``autoshard.runtime.shard`` the loss and every gradient shard equal the
single-device eager model's (fp32, rtol 1e-4); after 3 AdamW steps every
parameter shard equals the single-device model's; the collectives issued are
exactly the plan's steps (kind, mesh dims, bytes).

Coverage (a subset of model x plan x mesh, chosen so that the file stays near
two minutes on 2 cores: planning a tiny LLaMA or MoE on an 8-rank mesh takes
10-20 s, most of this file's time; every model and every plan kind runs at
least once on an 8-rank mesh, and both meshes get the solver's plan):

=========  =======================================================  ======
model      plans                                                    mesh
=========  =======================================================  ======
mlp        solver (memory-limited), DDP, FSDP, TP, FSDP+TP, pinned  2x2x2
llama3     FSDP+TP, TP                                              2x2x2
gpt2       solver (memory-limited), DDP                             2x4
moe        solver (memory-limited), FSDP                            2x4
=========  =======================================================  ======

(gpt2, llama3 and moe with one layer: the runtime is per op, a second
identical layer adds planning time and no new op.)

Non-adjacent fused collectives: the ``pinned`` MLP plan pins every weight to
``S(0)RS(0)`` on the 2x2x2 mesh, so gathering a weight fuses mesh dims 0
and 2; the plan must have such steps and every rank's trace must show each of
them as ONE collective on the flattened group of mesh dims [0, 2] (the 4
ranks that share this rank's coordinate on mesh dim 1, e.g. 0, 1, 4, 5).
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch
from gloo_ranks import (assert_matches_one_device, assert_trace_follows_schedule, equivalence,
                        planned_collectives_issued, scheduled_trace, spawn)

from costmodel.redistribute_steps import COLLECTIVE_STEPS

from autoshard.search.solve import prepare, solve_prepared
from examples.models import gpt2, llama3, mlp, moe

pytestmark = pytest.mark.slow

MESH_222 = ((2, 2, 2), ("dp", "fsdp", "tp"))
MESH_24 = ((2, 4), ("dp", "tp"))
ONE_LAYER = {"batch_size": 8, "n_layers": 1}
PROFILE = "a100-sxm-80gb"  # fusion is priced cheaper there at these sizes (test_gloo.py says why)
ADAMW_STEPS = 3
NON_ADJACENT_PINS = {"*.weight": "S(0)RS(0)"}


def _solved_under_memory(prep, fraction: float, ddp=None):
    """The solver's plan when memory allows only ``fraction`` of the DDP layout's peak."""
    ddp = ddp or solve_prepared(prep, baseline="ddp", time_limit=2)
    return solve_prepared(prep, time_limit=2, memory_limit=ddp.estimate.peak_memory_bytes * fraction)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    start = time.perf_counter()
    tmp = tmp_path_factory.mktemp("gloo8")
    plans: dict[str, object] = {}
    jobs: dict[str, list[dict]] = {"2x2x2": [], "2x4": []}

    def add(mesh_key, label, factory, plan, kwargs=None):
        path = tmp / f"{label}.json"
        plan.save(path)
        plans[label] = plan
        jobs[mesh_key].append({"label": label, "factory": factory, "plan": str(path), "kwargs": kwargs or {},
                               "adamw_steps": ADAMW_STEPS})

    model, inputs = mlp.tiny(device="meta")
    prep = prepare(model, inputs, *MESH_222, profile=PROFILE, device_type="cpu")
    ddp = solve_prepared(prep, baseline="ddp", time_limit=2)
    add("2x2x2", "mlp-222-solved", "mlp.tiny", _solved_under_memory(prep, 0.35, ddp))
    add("2x2x2", "mlp-222-ddp", "mlp.tiny", ddp)
    for baseline in ("fsdp", "tp", "fsdp+tp"):
        add("2x2x2", f"mlp-222-{baseline}", "mlp.tiny", solve_prepared(prep, baseline=baseline, time_limit=2))
    add("2x2x2", "mlp-222-pinned", "mlp.tiny", solve_prepared(prep, pins=NON_ADJACENT_PINS, time_limit=2))

    model, inputs = llama3.tiny(device="meta", **ONE_LAYER)
    prep = prepare(model, inputs, *MESH_222, profile=PROFILE, device_type="cpu")
    for baseline in ("fsdp+tp", "tp"):
        add("2x2x2", f"llama3-222-{baseline}", "llama3.tiny", solve_prepared(prep, baseline=baseline, time_limit=2),
            ONE_LAYER)

    model, inputs = gpt2.tiny(device="meta", **ONE_LAYER)
    prep = prepare(model, inputs, *MESH_24, profile=PROFILE, device_type="cpu")
    ddp = solve_prepared(prep, baseline="ddp", time_limit=2)
    add("2x4", "gpt2-24-solved", "gpt2.tiny", _solved_under_memory(prep, 0.6, ddp), ONE_LAYER)
    add("2x4", "gpt2-24-ddp", "gpt2.tiny", ddp, ONE_LAYER)

    model, inputs = moe.tiny(device="meta", **ONE_LAYER)
    prep = prepare(model, inputs, *MESH_24, profile=PROFILE, device_type="cpu")
    add("2x4", "moe-24-solved", "moe.tiny", _solved_under_memory(prep, 0.6), ONE_LAYER)
    add("2x4", "moe-24-fsdp", "moe.tiny", solve_prepared(prep, baseline="fsdp", time_limit=2), ONE_LAYER)

    planned_s = time.perf_counter() - start
    results = spawn(8, equivalence, ([(MESH_222, jobs["2x2x2"]), (MESH_24, jobs["2x4"])], None, False),
                    tmp / "ranks", timeout=240)
    print(f"\nplanning {planned_s:.1f} s, 8 ranks {time.perf_counter() - start - planned_s:.1f} s; per job (rank 0): "
          + ", ".join(f"{k} {v['seconds']:.1f}" for k, v in results[0].items() if isinstance(v, dict) and "seconds" in v))
    return plans, results


LABELS = ["mlp-222-solved", "mlp-222-ddp", "mlp-222-fsdp", "mlp-222-tp", "mlp-222-fsdp+tp", "mlp-222-pinned",
          "llama3-222-fsdp+tp", "llama3-222-tp", "gpt2-24-solved", "gpt2-24-ddp", "moe-24-solved", "moe-24-fsdp"]


def test_every_model_and_plan_kind_runs_on_an_8_rank_mesh(run):
    plans, _ = run
    assert set(plans) == set(LABELS)
    assert {label.split("-")[0] for label in LABELS} == {"mlp", "gpt2", "llama3", "moe"}
    kinds = {plan.options["baseline"] or "solved" for plan in plans.values()}
    assert {"solved", "ddp", "fsdp", "tp", "fsdp+tp"} <= kinds
    for label in ("mlp-222-solved", "gpt2-24-solved", "moe-24-solved"):  # the solver's plan really shards
        plan = plans[label]
        assert any("S" in text for text in plan.params.values()) or any(
            "S" in (out or "") for node in plan.nodes for out in node.out), label


@pytest.mark.parametrize("label", LABELS)
def test_loss_and_every_gradient_match_one_device(run, label):
    _, results = run
    assert_matches_one_device(results, label)


@pytest.mark.parametrize("label", LABELS)
def test_parameters_after_adamw_steps_match(run, label):
    _, results = run
    for rank, res in enumerate(results):
        r = res[label]
        got, want = r["grad_norms"]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)  # clip_grad_norm_ on DTensor gradients
        assert r["adamw"]
        compared = total = 0
        scale = max(float(p["want"].abs().max()) for p in r["params"].values() if p["want"].numel())
        for name, got, want in r["adamw"]:
            # A gradient that is zero in exact arithmetic (the key bias of attention:
            # softmax ignores a shift shared by all keys) is rounding noise, which
            # AdamW normalizes to steps of +-lr on both sides: compare the rest.
            grad = r["params"][name]["want"]
            live = grad.abs() > 1e-6 * scale
            torch.testing.assert_close(got[live], want[live], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{label} {name} rank {rank}: {m}")
            compared, total = compared + int(live.sum()), total + live.numel()
        assert compared > 0.5 * total, f"{label}: only {compared} of {total} elements have a nonzero gradient"


@pytest.mark.parametrize("label", LABELS)
def test_collectives_issued_are_the_plans_steps(run, label):
    plans, results = run
    plan = plans[label]
    planned = planned_collectives_issued(plan, results, label)
    assert planned, f"{label}: the plan has no collective (the test would be empty)"


@pytest.mark.parametrize("label", LABELS)
def test_later_steps_run_the_traced_graph(run, label):
    _, results = run
    assert all(res[label]["graph"] for res in results), f"{label}: the step was not traced into a graph"


@pytest.mark.parametrize("label", LABELS)
def test_collectives_are_issued_and_waited_where_the_schedule_says(run, label):
    plans, results = run
    assert plans[label].schedule is not None
    assert_trace_follows_schedule(plans[label], results, label)


def _group(rank: int, mesh_shape: tuple[int, ...], dims: tuple[int, ...]) -> list[int]:
    """Global ranks of ``rank``'s group over ``dims`` (row-major rank numbering)."""
    grid = torch.arange(math.prod(mesh_shape)).reshape(mesh_shape)
    coord = [int(c) for c in torch.nonzero(grid == rank)[0]]
    index = tuple(slice(None) if d in dims else coord[d] for d in range(len(mesh_shape)))
    return sorted(int(r) for r in grid[index].flatten())


def test_fused_collective_over_non_adjacent_mesh_dims_is_one_collective(run):
    plans, results = run
    planned = [s for r in plans["mlp-222-pinned"].redistributions for s in r.steps
               if s.collective in COLLECTIVE_STEPS and tuple(s.mesh_dims) == (0, 2)]
    assert planned, "the pinned plan has no step fused over mesh dims [0, 2]"
    assert {s.collective for s in planned} >= {"all_gather"}
    # one collective per fused step (a gather bucket's members: one for the bucket), on the
    # flattened group of dims 0 and 2, not one per mesh dim
    want = Counter(kind for _, kind, dims, *_ in scheduled_trace(plans["mlp-222-pinned"]) if tuple(dims) == (0, 2))
    assert want["all_gather"] >= 1
    for rank, res in enumerate(results):
        trace = res["mlp-222-pinned"]["trace"]
        on_02 = [(kind, ranks) for kind, dims, _, ranks, *_ in trace if tuple(dims) == (0, 2)]
        assert Counter(k for k, _ in on_02) == want
        assert all(sorted(ranks) == _group(rank, MESH_222[0], (0, 2)) for _, ranks in on_02)
    assert _group(0, MESH_222[0], (0, 2)) == [0, 1, 4, 5]


def test_fused_collectives_over_every_dim_of_each_mesh(run):
    """Fusions over adjacent dims (and all three) also run on their flattened group."""
    _, results = run
    seen = set()
    for label in LABELS:
        mesh = MESH_222[0] if "-222-" in label else MESH_24[0]
        for rank, res in enumerate(results):
            for kind, dims, _, ranks, *_ in res[label]["trace"]:
                assert sorted(ranks) == _group(rank, mesh, tuple(dims)), (label, kind, dims)
                if len(dims) > 1:
                    seen.add((len(mesh), tuple(dims)))
    assert {(3, (0, 2)), (2, (0, 1))} <= seen

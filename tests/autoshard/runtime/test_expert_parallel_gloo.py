"""Plans that run experts expert-parallel, on 4 gloo ranks, equal one device.

Tiny Hugging Face MoE models as given (Mixtral, Qwen3-MoE, DeepSeek-V3: 4 routed experts,
top-2, 32 tokens) solved with every experts node restricted to its expert-parallel
strategies (``exchange="expert_dispatch"``: a plan the price would not choose for models this
small, ``tests/autoshard/search/test_expert_parallel_solve.py``), on mesh (4,) (ep 4) and
(2, 2) (Mixtral: tokens split on dim 0, ep 2 on dim 1). Through ``autoshard.runtime.shard``:
the loss and every gradient shard equal the single-device run on each of two SGD steps (the
second step after the update; a plan with exchanges is interpreted, not traced,
``autoshard.runtime.program``); on every step each rank issues exactly the plan's all-to-alls
for its exchanges (``expert_ops.planned_all_to_alls``), and the plan's collectives.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from gloo_ranks import planned_collectives_issued, spawn

from costmodel.mesh import MeshSpec
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.runtime.expert_ops import planned_all_to_alls
from autoshard.search.solve import prepare, solve_prepared
from benchmarks.common.models import load as load_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")]

PROFILE = "a100-sxm-80gb"
STEPS, LR = 2, 0.1
JOBS = [("hf_mixtral", (4,), ("ep",)), ("hf_qwen3_moe", (4,), ("ep",)), ("hf_deepseek_v3", (4,), ("ep",)),
        ("hf_mixtral", (2, 2), ("dp", "ep"))]


def _only_expert_parallel(node, strategies):
    """Restrict: an experts node keeps its exchange strategies with tokens split on every mesh dim."""
    if not str(node.target).startswith("autoshard.experts"):
        return strategies
    return [s for s in strategies if s.exchange is not None and all(
        str(p) == "S(0)" for p in s.input_placements[0])] or strategies


def _forced_plan(factory: str, mesh_shape, names):
    model, inputs = load_model(f"hf.{factory}")
    prep = prepare(model, inputs, mesh_shape, names, profile=PROFILE, device_type="cpu", recompute="none")
    graph = build_graph(prep.traced, MeshSpec(mesh_shape, names), load(PROFILE), optimizer=prep.graph.optimizer,
                        recompute=False, restrict=_only_expert_parallel)
    return solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)


def _rank(rank: int, world: int, meshes) -> dict:
    """Two SGD steps of each job, sharded and on one device (SGD: the second step's gradients
    are compared at the same tolerance as the first's; Adam would amplify last bits)."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import expert_dispatch, local_slice, shard
    from autoshard.runtime.execute import placements_of
    from benchmarks.common.equivalence import local_of
    from benchmarks.common.models import loss_of

    counted = {"n": 0}
    exchange = expert_dispatch._all_to_all

    def counting(*args, **kwargs):
        counted["n"] += 1
        return exchange(*args, **kwargs)

    expert_dispatch._all_to_all = counting  # the one function every exchange of the runtime goes through
    out = {}
    for (mesh_shape, names), jobs in meshes:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        coord = tuple(mesh.get_coordinate())
        for job in jobs:
            model, inputs = load_model(job["factory"])
            reference = copy.deepcopy(model)
            sharded = shard(model, mesh, job["plan"], inputs, trace_collectives=True)
            opt = torch.optim.SGD(sharded.parameters(), lr=LR)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
            steps = []
            for _ in range(STEPS):
                counted["n"] = 0
                loss = loss_of(sharded, inputs)
                loss.backward()
                ref_loss = loss_of(reference, inputs)
                ref_loss.backward()
                ref_params = dict(reference.named_parameters())
                grads = {name: (local_of(p.grad).clone(), local_slice(
                    ref_params[name].grad, placements_of(sharded.plan.params[name], len(mesh_shape)), mesh_shape,
                    coord)) for name, p in sharded.named_parameters()}
                steps.append({"loss": loss.detach().clone(), "ref_loss": ref_loss.detach().clone(), "grads": grads,
                              "all_to_alls": counted["n"],
                              "trace": [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                                        for r in sharded.collective_trace]})
                opt.step()
                ref_opt.step()
                opt.zero_grad()
                ref_opt.zero_grad()
            out[job["label"]] = {"steps": steps, "trace": steps[0]["trace"],
                                 "graph": sharded._runner.step_graph is not None}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ep")
    plans, meshes = {}, {}
    for factory, mesh_shape, names in JOBS:
        label = f"{factory}-{'x'.join(map(str, mesh_shape))}"
        plan = plans[label] = _forced_plan(factory, mesh_shape, names)
        path = tmp / f"{label}.json"
        plan.save(path)
        meshes.setdefault((mesh_shape, names), []).append(
            {"label": label, "factory": f"hf.{factory}", "plan": str(path)})
    results = spawn(4, _rank, (list(meshes.items()),), tmp / "ranks", timeout=600)
    return plans, results


@pytest.mark.parametrize("label", [f"{f}-{'x'.join(map(str, m))}" for f, m, _ in JOBS])
def test_expert_parallel_plan_equals_one_device(run, label) -> None:
    plans, results = run
    plan = plans[label]
    ep = [n for n in plan.nodes if n.exchange is not None]
    assert ep and all(n.op.startswith("autoshard.experts") for n in ep)
    for rank, res in enumerate(results):
        steps = res[label]["steps"]
        assert len(steps) == STEPS
        for k, step in enumerate(steps):
            torch.testing.assert_close(step["loss"], step["ref_loss"], rtol=1e-4, atol=1e-6)
            assert step["grads"]
            for name, (got, want) in step["grads"].items():
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6,
                                           msg=lambda m, name=name: f"step {k + 1} rank {rank} {name}: {m}")
            assert step["all_to_alls"] == planned_all_to_alls(plan)  # each step: the plan's exchanges
    planned_collectives_issued(plan, results, label)
    assert not any(res[label]["graph"] for res in results)  # run-time split sizes: interpreted, never traced
    assert planned_all_to_alls(plan) == 8 * len(ep) // 2  # 3 forward + 5 backward per MoE layer

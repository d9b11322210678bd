"""Plans that run experts expert-parallel, on 4 gloo ranks, equal one device.

Tiny Hugging Face MoE models as given (Mixtral, Qwen3-MoE, DeepSeek-V3: 4 routed experts,
top-2, 32 tokens) solved with every experts node restricted to its expert-parallel
strategies (``exchange="expert_dispatch"``: a plan the price would not choose for models this
small, ``tests/autoshard/search/test_expert_parallel_solve.py``), on mesh (4,) (ep 4) and
(2, 2) (Mixtral: tokens split on dim 0, ep 2 on dim 1). Through ``autoshard.runtime.shard``:
the loss and every gradient shard equal the single-device run on each of two SGD steps (the
second step after the update; a plan with exchanges is interpreted, not traced,
``autoshard.runtime.traced_step``); on every step each rank issues exactly the plan's all-to-alls
for its exchanges (``expert_ops.planned_all_to_alls``), and the plan's collectives.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from equivalence import assert_steps_match_one_device
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
# one decoder layer where a second is the same op again (the runtime is per op); DeepSeek-V3 keeps
# its two: its first layer is dense (first_k_dense_replace=1), the second the MoE one
OVERRIDES = {"hf_mixtral": {"num_hidden_layers": 1}, "hf_qwen3_moe": {"num_hidden_layers": 1}}


def _only_expert_parallel(node, strategies):
    """Restrict: an experts node keeps its exchange strategies with tokens split on every mesh dim."""
    if not str(node.target).startswith("autoshard.experts"):
        return strategies
    return [s for s in strategies if s.exchange is not None and all(
        str(p) == "S(0)" for p in s.input_placements[0])] or strategies


def _forced_plan(factory: str, mesh_shape, names):
    model, inputs = load_model(f"hf.{factory}", OVERRIDES.get(factory))
    prep = prepare(model, inputs, mesh_shape, names, profile=PROFILE, device_type="cpu", recompute="none")
    graph = build_graph(prep.traced, MeshSpec(mesh_shape, names), load(PROFILE), optimizer=prep.graph.optimizer,
                        recompute=False, restrict=_only_expert_parallel)
    return solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)


def _rank(rank: int, world: int, meshes) -> dict:
    """Two SGD steps of each job, sharded and on one device (``equivalence.sgd_steps``); per step
    the ranks of each exchange's all-to-all group."""
    import torch.distributed as dist
    from equivalence import sgd_steps
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import expert_dispatch
    from benchmarks.common.models import load as load_model

    issued: list[tuple[int, ...]] = []
    exchange = expert_dispatch._all_to_all

    def counting(rows, out_splits, in_splits, group):
        issued.append(tuple(dist.get_process_group_ranks(group)))
        return exchange(rows, out_splits, in_splits, group)

    expert_dispatch._all_to_all = counting  # the one function every exchange of the runtime goes through
    out = {}
    for (mesh_shape, names), jobs in meshes:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        for job in jobs:
            model, inputs = load_model(job["factory"], job["overrides"])
            out[job["label"]] = sgd_steps(model, inputs, mesh, job["plan"], steps=STEPS, lr=LR, issued=issued)
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
            {"label": label, "factory": f"hf.{factory}", "plan": str(path), "overrides": OVERRIDES.get(factory)})
    results = spawn(4, _rank, (list(meshes.items()),), tmp / "ranks", timeout=600)
    return plans, results


@pytest.mark.parametrize("label", [f"{f}-{'x'.join(map(str, m))}" for f, m, _ in JOBS])
def test_expert_parallel_plan_equals_one_device(run, label) -> None:
    plans, results = run
    plan = plans[label]
    ep = [n for n in plan.nodes if n.exchange is not None]
    assert ep and all(n.op.startswith("autoshard.experts") for n in ep)

    def exchanges_are_planned(rank: int, job: dict, step: dict) -> None:
        assert len(step["issued"]) == planned_all_to_alls(plan), f"rank {rank}"  # each step: the plan's exchanges

    assert_steps_match_one_device(results, label, steps=STEPS, check_step=exchanges_are_planned)
    planned_collectives_issued(plan, results, label)
    assert not any(res[label]["graph"] for res in results)  # run-time split sizes: interpreted, never traced
    assert planned_all_to_alls(plan) == 8 * len(ep) // 2  # 3 forward + 5 backward per MoE layer

"""Expert parallelism beside data and tensor parallelism on 8 gloo ranks: mesh dp 2 x ep 2 x tp 2.

Tiny Hugging Face MoE models as given (Mixtral and Qwen3-MoE: 4 routed experts, top-2,
32 tokens; one layer, as test_gloo8.py runs its models) solved with every experts node
restricted to the strategy this layout runs: tokens split on dp and ep, the experts split
on E over ep (``exchange="expert_dispatch"`` on mesh dim 1) and each expert's h split over tp (``gate_up`` ``_S(1,sf=2)``, ``down``
``S(2)``; the output a partial sum over tp). The rest of the model is the solver's choice
on the same mesh (the seeded search's strategies, as ``prepare`` keeps them on a 3-D
mesh). The price would not pick EP for experts this small
(``tests/autoshard/search/test_expert_parallel_solve.py``), so the restriction forces it (a
restriction, as ``test_expert_parallel_gloo.py`` does: ``search/pins.py`` pins tensors, not
an op's strategy).

Through ``autoshard.runtime.shard``, two SGD steps: the loss and every gradient shard equal
the single-device run, on every rank; each rank issues exactly the plan's all-to-alls for
its exchanges, on its ep group (the 2 ranks that share its dp and tp coordinates), and the
plan's other collectives.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from gloo_ranks import planned_collectives_issued, spawn

from costmodel.placements import StridedShard

from autoshard.graph.builder import build_graph
from autoshard.graph.restrict import seeded_restriction
from autoshard.plan.options import SolveOptions
from autoshard.runtime.expert_ops import planned_all_to_alls
from autoshard.search.solve import SEED_SHARE, prepare, solve_prepared
from benchmarks.common.models import load as load_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")]

PROFILE = "a100-sxm-80gb"
MESH, NAMES = (2, 2, 2), ("dp", "ep", "tp")
EP_DIM, TP_DIM = 1, 2
STEPS, LR = 2, 0.1
FACTORIES = ("hf_mixtral", "hf_qwen3_moe")
ONE_LAYER = {"num_hidden_layers": 1}  # the runtime is per op: a second identical layer adds time, no new op


def _dp_ep_tp(node, strategies):
    """An experts node keeps its exchange on the ep dim with tokens split on dp and ep and
    every expert's h split on tp (its ``gate_up`` strided on tensor dim 1 over tp)."""
    if not str(node.target).startswith("autoshard.experts"):
        return strategies
    first = 1 if str(node.target).startswith("autoshard.experts_backward") else 0
    kept = [s for s in strategies if s.exchange == ("expert_dispatch", EP_DIM)
            and [str(p) for p in s.input_placements[first][:TP_DIM]] == ["S(0)", "S(0)"]
            and isinstance(s.input_placements[first + 3][TP_DIM], StridedShard)]
    if not kept:
        raise AssertionError(f"{node.name}: no dp x ep x tp exchange strategy offered")
    return kept


def _forced_plan(factory: str):
    """The solver's plan with the experts nodes restricted (:func:`_dp_ep_tp`) and every other node
    to the seeded search's strategies (a 3-D mesh's full enumeration takes minutes)."""
    model, inputs = load_model(f"hf.{factory}", ONE_LAYER)
    memo: dict = {}
    prep = prepare(model, inputs, MESH, NAMES, profile=PROFILE, device_type="cpu", recompute="none",
                   search="seeded", seed_memo=memo)
    graph = prep.graph
    seeded, _ = seeded_restriction(prep.traced, graph.mesh, graph.profile, optimizer=graph.optimizer,
                                   time_limit=SEED_SHARE * SolveOptions().time_limit, memo=memo)

    def restrict(node, strategies):
        return _dp_ep_tp(node, strategies) if str(node.target).startswith("autoshard.experts") \
            else seeded(node, strategies)

    graph = build_graph(prep.traced, graph.mesh, graph.profile, optimizer=graph.optimizer, recompute=False,
                        restrict=restrict)
    return solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)


def _rank(rank: int, world: int, jobs) -> dict:
    """Two SGD steps of each job, sharded and on one device; every all-to-all of the exchanges
    counted with the ranks of its group."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import expert_dispatch, local_slice, shard
    from autoshard.runtime.execute import placements_of
    from benchmarks.common.equivalence import local_of
    from benchmarks.common.models import loss_of

    issued: list[tuple[int, ...]] = []
    exchange = expert_dispatch._all_to_all

    def counting(rows, out_splits, in_splits, group):
        issued.append(tuple(dist.get_process_group_ranks(group)))
        return exchange(rows, out_splits, in_splits, group)

    expert_dispatch._all_to_all = counting  # the one function every exchange of the runtime goes through
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=NAMES)
    coord = tuple(mesh.get_coordinate())
    out = {}
    for job in jobs:
        model, inputs = load_model(job["factory"], ONE_LAYER)
        reference = copy.deepcopy(model)
        sharded = shard(model, mesh, job["plan"], inputs, trace_collectives=True)
        opt = torch.optim.SGD(sharded.parameters(), lr=LR)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
        steps = []
        for _ in range(STEPS):
            issued.clear()
            loss = loss_of(sharded, inputs)
            loss.backward()
            ref_loss = loss_of(reference, inputs)
            ref_loss.backward()
            ref_params = dict(reference.named_parameters())
            grads = {name: (local_of(p.grad).clone(), local_slice(
                ref_params[name].grad, placements_of(sharded.plan.params[name], len(MESH)), MESH, coord))
                for name, p in sharded.named_parameters()}
            steps.append({"loss": loss.detach().clone(), "ref_loss": ref_loss.detach().clone(), "grads": grads,
                          "all_to_alls": list(issued),
                          "trace": [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                                    for r in sharded.collective_trace]})
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
        out[job["label"]] = {"steps": steps, "trace": steps[0]["trace"], "coord": coord}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ep8")
    plans, jobs = {}, []
    for factory in FACTORIES:
        plan = plans[factory] = _forced_plan(factory)
        path = tmp / f"{factory}.json"
        plan.save(path)
        jobs.append({"label": factory, "factory": f"hf.{factory}", "plan": str(path)})
    results = spawn(8, _rank, (jobs,), tmp / "ranks", timeout=600)
    return plans, results


def _ep_group(coord: tuple[int, ...]) -> tuple[int, ...]:
    """Global ranks (row-major) that share ``coord`` but on the ep dim."""
    grid = torch.arange(8).reshape(MESH)
    return tuple(int(r) for r in grid[coord[0], :, coord[2]])


@pytest.mark.parametrize("factory", FACTORIES)
def test_dp_ep_tp_plan_equals_one_device(run, factory) -> None:
    plans, results = run
    plan = plans[factory]
    ep = [n for n in plan.nodes if n.exchange is not None]
    assert ep and all(n.exchange == ("expert_dispatch", EP_DIM) for n in ep)
    assert all(n.op.startswith("autoshard.experts") for n in ep)
    forward = [n for n in ep if n.op == "autoshard.experts.default"]
    assert forward and all(n.inputs[3] == "RS(0)_S(1,sf=2)" and n.out[0].endswith("P(sum)") for n in forward)
    for rank, res in enumerate(results):
        steps = res[factory]["steps"]
        assert len(steps) == STEPS
        for k, step in enumerate(steps):
            torch.testing.assert_close(step["loss"], step["ref_loss"], rtol=1e-4, atol=1e-6)
            assert step["grads"]
            for name, (got, want) in step["grads"].items():
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6,
                                           msg=lambda m, name=name: f"step {k + 1} rank {rank} {name}: {m}")
            # each step: the plan's exchanges, every one on this rank's ep group
            assert len(step["all_to_alls"]) == planned_all_to_alls(plan)
            assert set(step["all_to_alls"]) == {_ep_group(res[factory]["coord"])}
    planned_collectives_issued(plan, results, factory)
    assert planned_all_to_alls(plan) == 8 * len(ep) // 2  # 3 forward + 5 backward per MoE layer

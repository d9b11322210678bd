"""Plans that run attention context-parallel, on 4 gloo ranks (cp 2 x tp 2), equal one device.

The example LLaMA (causal, ``is_causal`` attention) and Hugging Face models as given (LLaMA; Mistral
with a sliding window of 8 under 16 tokens; Gemma 3 with a sliding-window layer and a full one:
their attention takes an explicit mask, split on its query rows),
solved on mesh (2, 2) ``cp, tp`` with every attention node (forward and backward) restricted to its
context-parallel strategies on mesh dim 0 (``exchange=("context_gather", 0)``, contiguous rows, or
``"context_gather_balanced"``, the causal head-and-tail layout: plans the price would not choose
for models this small). Through ``autoshard.runtime.shard``: the loss and every gradient shard
equal the single-device run on each of two SGD steps (a plan with exchanges is interpreted, not
traced); on every step each rank issues exactly the plan's collectives for its redistributions
and, for its attention nodes, the all-gathers, reduce-scatters and all-to-alls
``context_ops.planned_context_collectives`` counts, each on the CP mesh dim's group.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections import Counter

import pytest
import torch
from gloo_ranks import planned_collectives_issued, spawn

from costmodel.mesh import MeshSpec
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.runtime.context_ops import planned_context_collectives
from autoshard.search.solve import prepare, solve_prepared
from benchmarks.common.models import load as load_model

pytestmark = [pytest.mark.slow]

PROFILE = "a100-sxm-80gb"
STEPS, LR = 2, 0.1
ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu"
MESH, NAMES = (2, 2), ("cp", "tp")
JOBS = [("llama3.tiny", "context_gather"), ("llama3.tiny", "context_gather_balanced")]
if importlib.util.find_spec("transformers") is not None:
    JOBS += [("hf.hf_llama", "context_gather"), ("hf.hf_mistral", "context_gather"), ("hf.hf_gemma3", "context_gather")]


def only_context_parallel(kind: str, mesh_dim: int = 0):
    """Restrict: an attention node keeps its ``kind`` exchange strategies on ``mesh_dim``."""
    def restrict(node, strategies):
        if not str(node.target).startswith(ATTENTION):
            return strategies
        return [s for s in strategies if s.exchange == (kind, mesh_dim)] or strategies
    return restrict


def forced_plan(factory: str, kind: str, mesh_shape=MESH, names=NAMES, mesh_dim: int = 0, overrides=None):
    model, inputs = load_model(factory, overrides)
    prep = prepare(model, inputs, mesh_shape, names, profile=PROFILE, device_type="cpu", recompute="none")
    graph = build_graph(prep.traced, MeshSpec(mesh_shape, names), load(PROFILE), optimizer=prep.graph.optimizer,
                        recompute=False, restrict=only_context_parallel(kind, mesh_dim))
    return solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)


def run_jobs(rank: int, world: int, meshes) -> dict:
    """Two SGD steps of each job, sharded and on one device (SGD: the second step's gradients
    compare at the first's tolerance); per step the exchange collectives by (kind, mesh dim)."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import context_comm, local_slice, shard
    from autoshard.runtime.execute import placements_of
    from benchmarks.common.equivalence import local_of
    from benchmarks.common.models import loss_of

    issued: list[tuple[str, str]] = []
    plain = context_comm.issue

    def counting(kind, tensor, *args):
        issued.append((kind, args[-1]))  # the group's name comes last
        return plain(kind, tensor, *args)

    context_comm.issue = counting  # the one function every context exchange's collective goes through
    out = {}
    for (mesh_shape, names), jobs in meshes:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        coord = tuple(mesh.get_coordinate())
        dim_of = {mesh.get_group(d).group_name: d for d in range(len(mesh_shape))}
        for job in jobs:
            model, inputs = load_model(job["factory"], job.get("overrides"))
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
                    ref_params[name].grad, placements_of(sharded.plan.params[name], len(mesh_shape)), mesh_shape,
                    coord)) for name, p in sharded.named_parameters()}
                steps.append({"loss": loss.detach().clone(), "ref_loss": ref_loss.detach().clone(), "grads": grads,
                              "exchanges": Counter((kind, dim_of[group]) for kind, group in issued),
                              "trace": [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                                        for r in sharded.collective_trace]})
                opt.step()
                ref_opt.step()
                opt.zero_grad()
                ref_opt.zero_grad()
            out[job["label"]] = {"steps": steps, "trace": steps[0]["trace"],
                                 "graph": sharded._runner.step_graph is not None}
    context_comm.issue = plain
    return out


def label_of(factory: str, kind: str) -> str:
    return f"{factory}-{kind}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp")
    plans, jobs = {}, []
    for factory, kind in JOBS:
        label = label_of(factory, kind)
        plan = plans[label] = forced_plan(factory, kind)
        path = tmp / f"{label}.json"
        plan.save(path)
        jobs.append({"label": label, "factory": factory, "plan": str(path)})
    results = spawn(4, run_jobs, ([((MESH, NAMES), jobs)],), tmp / "ranks", timeout=900)
    return plans, results


def assert_equal_one_device(plan, results, label, kind, n_attention_layers, mesh_dim: int = 0) -> None:
    """Every rank's loss and gradients equal one device on each step; its collectives are the plan's."""
    cp_nodes = [n for n in plan.nodes if n.exchange is not None]
    assert len(cp_nodes) == 2 * n_attention_layers and all(n.op.startswith(ATTENTION) for n in cp_nodes)
    assert all(n.exchange == (kind, mesh_dim) for n in cp_nodes)
    planned = planned_context_collectives(plan)
    assert planned[("all_gather", mesh_dim)] == 2 * n_attention_layers  # forward and backward gather K/V
    for rank, res in enumerate(results):
        steps = res[label]["steps"]
        assert len(steps) == STEPS
        for k, step in enumerate(steps):
            torch.testing.assert_close(step["loss"], step["ref_loss"], rtol=1e-4, atol=1e-6)
            assert step["grads"]
            for name, (got, want) in step["grads"].items():
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, name=name: f"step {k + 1} rank {rank} {name}: {m}")
            assert step["exchanges"] == planned, f"step {k + 1} rank {rank}"
    planned_collectives_issued(plan, results, label)
    assert not any(res[label]["graph"] for res in results)  # exchanges: interpreted, never traced


@pytest.mark.parametrize("factory,kind", JOBS, ids=[label_of(f, k) for f, k in JOBS])
def test_context_parallel_plan_equals_one_device(run, factory, kind) -> None:
    plans, results = run
    label = label_of(factory, kind)
    assert_equal_one_device(plans[label], results, label, kind, n_attention_layers=2)
    moves = planned_context_collectives(plans[label])[("all_to_all", 0)]
    assert moves == (8 if kind == "context_gather_balanced" else 0)  # 2 per node, 2 layers x 2 nodes

"""Plans that run experts expert-parallel, on 4 gloo ranks, equal one device.

Tiny Hugging Face MoE models as given (Mixtral, Qwen3-MoE, DeepSeek-V3: 4 routed experts,
top-2, 32 tokens) solved with every experts node restricted to its expert-parallel
strategies (``exchange="expert_dispatch"``: a plan the price would not choose for models this
small, ``tests/autoshard/search/test_expert_parallel_solve.py``), on mesh (4,) (ep 4) and
(2, 2) (Mixtral: tokens split on dim 0, ep 2 on dim 1). And the einsum form
(``examples/models/moe.py`` with GShard's routing groups: 8 experts, 4 groups of 16 tokens, one
layer) on (4,): its groups and its experts split over the 4 ranks, the dispatched tokens
``expert_in[e, g, c, d]`` changing their split from ``g`` to ``e`` in a fixed-size all-to-all and
the experts' outputs back the same way, static placements the plan prices as redistributions
(the solver alone, for experts this small, would gather the tokens instead: the restriction
forces the split). Through ``autoshard.runtime.shard``:
the loss and every gradient shard equal the single-device run on each of two SGD steps (the
second step after the update; a plan with exchanges is interpreted, not traced,
``autoshard.runtime.traced_step``); on every step each rank issues exactly the plan's all-to-alls
for its exchanges (``expert_ops.planned_all_to_alls``), and the plan's collectives.
"""

from __future__ import annotations

import importlib.util

import pytest
from equivalence import assert_steps_match_one_device
from gloo_ranks import planned_collectives_issued, restricted_plan, spawn

from autoshard.runtime.expert_ops import planned_all_to_alls
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
GSHARD = {"n_layers": 1, "n_experts": 8, "n_groups": 4, "batch_size": 4}
"""The einsum form's job: ``moe.tiny`` with 8 experts and 4 routing groups of 16 tokens."""


def _only_expert_parallel(node, strategies):
    """Restrict: an experts node keeps its exchange strategies with tokens split on every mesh dim."""
    if not str(node.target).startswith("autoshard.experts"):
        return strategies
    return [s for s in strategies if s.exchange is not None and all(
        str(p) == "S(0)" for p in s.input_placements[0])] or strategies


def _forced_plan(factory: str, mesh_shape, names, traces: dict | None = None):
    """The plan with the experts nodes restricted (``traces``: the plans of one model share its trace)."""
    from equivalence import trace_key_of

    model, inputs = load_model(f"hf.{factory}", OVERRIDES.get(factory))
    return restricted_plan(model, inputs, mesh_shape, names, lambda _: _only_expert_parallel, profile=PROFILE,
                           traces=traces, trace_key=trace_key_of(f"hf.{factory}", OVERRIDES.get(factory)))


def _groups_and_experts_split(node, strategies):
    """Restrict: every bmm over the 4 groups or the 8 experts (the einsums' and the experts' own,
    forward and backward) keeps its strategies with every input split on that batch dim."""
    if "bmm" not in str(node.target):
        return strategies
    lead = {a.meta["val"].shape[0] for a in node.args if hasattr(a, "meta") and "val" in a.meta}
    if not lead & {GSHARD["n_experts"], GSHARD["n_groups"]}:
        return strategies
    return [s for s in strategies if all(str(p[0]) == "S(0)" for p in s.input_placements)] or strategies


def _gshard_plan():
    model, inputs = load_model("moe.tiny", GSHARD)
    return restricted_plan(model, inputs, (4,), ("ep",), lambda _: _groups_and_experts_split, profile=PROFILE)


def _rank(rank: int, world: int, meshes) -> dict:
    """Two SGD steps of each job, sharded and on one device (``equivalence.sgd_steps``); per step
    the ranks of each exchange's all-to-all group."""
    import torch.distributed as dist
    from equivalence import sgd_steps, trace_key_of
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import expert_dispatch
    from benchmarks.common.models import load as load_model

    issued: list[tuple[int, ...]] = []
    exchange = expert_dispatch._all_to_all

    def counting(rows, out_splits, in_splits, group):
        issued.append(tuple(dist.get_process_group_ranks(group)))
        return exchange(rows, out_splits, in_splits, group)

    expert_dispatch._all_to_all = counting  # the one function every exchange of the runtime goes through
    out, traces = {}, {}  # the jobs of one model share its trace (sgd_steps)
    for (mesh_shape, names), jobs in meshes:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        for job in jobs:
            model, inputs = load_model(job["factory"], job["overrides"])
            out[job["label"]] = sgd_steps(model, inputs, mesh, job["plan"], steps=STEPS, lr=LR, issued=issued,
                                          traces=traces, trace_key=trace_key_of(job["factory"], job["overrides"]))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ep")
    plans, meshes, traces = {}, {}, {}
    for factory, mesh_shape, names in JOBS:
        label = f"{factory}-{'x'.join(map(str, mesh_shape))}"
        plan = plans[label] = _forced_plan(factory, mesh_shape, names, traces)
        path = tmp / f"{label}.json"
        plan.save(path)
        meshes.setdefault((mesh_shape, names), []).append(
            {"label": label, "factory": f"hf.{factory}", "plan": str(path), "overrides": OVERRIDES.get(factory)})
    plans["gshard"] = _gshard_plan()
    plans["gshard"].save(tmp / "gshard.json")
    meshes[((4,), ("ep",))].append({"label": "gshard", "factory": "moe.tiny", "plan": str(tmp / "gshard.json"),
                                    "overrides": GSHARD})
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
    # the runtime's measured imbalance: one number per forward experts node, the same on every rank
    # of an ep group (each group routes its own tokens)
    ep_dim = ep[0].exchange[1]
    forward = sorted(n.name for n in ep if n.op == "autoshard.experts.default")
    by_group: dict[tuple, list[dict]] = {}
    for res in results:
        coord = res[label]["coord"]
        by_group.setdefault(coord[:ep_dim] + coord[ep_dim + 1:], []).append(res[label]["expert_imbalance"])
    for measured in by_group.values():
        assert sorted(measured[0]) == forward and all(m == measured[0] for m in measured)
        assert all(1.0 <= v <= plan.fingerprint.mesh_shape[ep_dim] for v in measured[0].values())


def test_einsum_form_runs_its_experts_split_with_fixed_size_all_to_alls(run) -> None:
    plans, results = run
    plan = plans["gshard"]
    assert {plan.params[f"layers.0.moe.{w}"] for w in ("w1", "w2", "w3")} == {"S(0)"}  # 2 of the 8 experts a rank
    moves = [s for r in plan.redistributions for s in r.steps if s.collective == "all_to_all"]
    # forward: the dispatched tokens to their experts and the outputs back; backward: their gradients
    assert len(moves) >= 4
    assert_steps_match_one_device(results, "gshard", steps=STEPS)
    issued = planned_collectives_issued(plan, results, "gshard")
    assert sum(n for key, n in issued.items() if key[3] == "all_to_all") == len(moves)
    assert not any(step["issued"] for res in results for step in res["gshard"]["steps"])  # no run-time splits

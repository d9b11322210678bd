"""Expert parallelism beside data and tensor parallelism on 8 gloo ranks: mesh dp 2 x ep 2 x tp 2.

Tiny Hugging Face MoE models as given (Mixtral, Qwen3-MoE and DeepSeek-V3: 4 routed experts,
top-2, 32 tokens; one layer, as test_gloo8.py runs its models, DeepSeek two: its first is dense),
and the einsum form (``examples/models/moe.py`` with 4 GShard routing groups), solved with every experts node
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

import importlib.util

import pytest
import torch
from equivalence import assert_steps_match_one_device
from gloo_ranks import planned_collectives_issued, restricted_plan

from costmodel.placements import StridedShard

from autoshard.runtime.expert_ops import planned_all_to_alls
from benchmarks.common.models import load as load_model

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")]

PROFILE = "a100-sxm-80gb"
MESH, NAMES = (2, 2, 2), ("dp", "ep", "tp")
EP_DIM, TP_DIM = 1, 2
STEPS, LR = 2, 0.1
FACTORIES = ("hf_mixtral", "hf_qwen3_moe", "hf_deepseek_v3")
ONE_LAYER = {"num_hidden_layers": 1}  # the runtime is per op: a second identical layer adds time, no new op
OVERRIDES = {"hf_deepseek_v3": {"num_hidden_layers": 2}}  # its first layer is dense (first_k_dense_replace=1)
GSHARD = {"n_layers": 1, "n_experts": 8, "n_groups": 4, "batch_size": 4}
"""The einsum form (``examples/models/moe.py``): 8 experts, 4 GShard routing groups of 16 tokens,
its group einsums split over dp x ep and its experts over ep (the rest as the seeded search has it)."""


def overrides_of(factory: str) -> dict:
    return OVERRIDES.get(factory, ONE_LAYER)


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


def _seeded_plan(model, inputs, forced):
    """The solver's plan with the nodes ``forced(node, strategies)`` answers for (not None)
    restricted to its answer and every other node to the seeded search's strategies (a 3-D mesh's
    full enumeration takes minutes); the graph built once (``gloo_ranks.restricted_plan``)."""
    def restrict_of(seeded):
        def restrict(node, strategies):
            kept = forced(node, strategies)
            return seeded(node, strategies) if kept is None else kept
        return restrict

    return restricted_plan(model, inputs, MESH, NAMES, restrict_of, profile=PROFILE, search="seeded")


def _forced_plan(factory: str):
    """The plan with the experts nodes restricted (:func:`_dp_ep_tp`), the rest seeded."""
    model, inputs = load_model(f"hf.{factory}", overrides_of(factory))
    return _seeded_plan(model, inputs, lambda node, strategies: _dp_ep_tp(node, strategies)
                        if str(node.target).startswith("autoshard.experts") else None)


def _groups_and_experts_on_ep(node, strategies):
    """The einsum form: every bmm over the 4 groups or the 8 experts keeps its strategies with
    every input split on that batch dim over ep (the rest of the model as the seeded search has it)."""
    if "bmm" not in str(node.target):
        return None
    lead = {a.meta["val"].shape[0] for a in node.args if hasattr(a, "meta") and "val" in a.meta}
    if not lead & {GSHARD["n_experts"], GSHARD["n_groups"]}:
        return None
    dims = (0, EP_DIM) if GSHARD["n_groups"] in lead else (EP_DIM,)  # the groups over dp x ep, experts over ep
    kept = [s for s in strategies if all(str(p[d]) == "S(0)" for p in s.input_placements for d in dims)]
    if not kept:
        raise AssertionError(f"{node.name}: no strategy splits its batch dim on mesh dims {dims}")
    return kept


def gshard_plan():
    """The einsum form's plan on dp x ep x tp (:func:`_groups_and_experts_on_ep`)."""
    return _seeded_plan(*load_model("moe.tiny", GSHARD), _groups_and_experts_on_ep)


def _rank(rank: int, world: int, jobs) -> dict:
    """Two SGD steps of each job, sharded and on one device (``equivalence.sgd_steps``); every
    all-to-all of the exchanges counted with the ranks of its group."""
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
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=NAMES)
    out = {}
    for job in jobs:
        model, inputs = load_model(job["factory"], job.get("overrides", ONE_LAYER))
        out[job["label"]] = sgd_steps(model, inputs, mesh, job["plan"], steps=STEPS, lr=LR, issued=issued)
    return out


@pytest.fixture(scope="module")
def run(ranks_2x2x2):
    """The plans and results of the spawn this test shares with ``test_context_parallel_gloo8``
    and ``test_pipeline_tp_gloo`` (``ranks_2x2x2.py``)."""
    return ranks_2x2x2


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

    def exchanges_are_planned(rank: int, job: dict, step: dict) -> None:
        # each step: the plan's exchanges, every one on this rank's ep group
        assert len(step["issued"]) == planned_all_to_alls(plan), f"rank {rank}"
        assert set(step["issued"]) == {_ep_group(job["coord"])}, f"rank {rank}"

    assert_steps_match_one_device(results, factory, steps=STEPS, check_step=exchanges_are_planned)
    planned_collectives_issued(plan, results, factory)
    assert planned_all_to_alls(plan) == 8 * len(ep) // 2  # 3 forward + 5 backward per MoE layer


def test_einsum_form_on_dp_ep_tp_splits_groups_and_experts_and_equals_one_device(run) -> None:
    """The groups' einsums split over dp x ep, the experts over ep: the solver moves the tokens
    between the two as its price says (at these sizes one gather and local slices beat an
    all-to-all plus a gather; ``test_expert_parallel_gloo.py`` runs the all-to-all form)."""
    from autoshard.runtime.execute import placements_of

    plans, results = run
    plan = plans["gshard"]
    for w in ("w1", "w2", "w3"):  # each ep rank holds 4 of the 8 experts
        assert str(placements_of(plan.params[f"layers.0.moe.{w}"], 3)[EP_DIM]) == "S(0)"
    bmms = [n for n in plan.nodes if n.op == "aten.bmm.default"]
    assert any(n.inputs[0].startswith("S(0)S(0)") for n in bmms)  # 4 groups: one per dp x ep rank
    assert_steps_match_one_device(results, "gshard", steps=STEPS)
    planned_collectives_issued(plan, results, "gshard")

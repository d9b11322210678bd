"""Tensor parallelism inside pipeline stages: 8 gloo ranks, pp 2 x dp 2 x tp 2, against one device.

Two models in one spawn: the Hugging Face ``LlamaForCausalLM`` as given
(``examples.models.hf.hf_llama``) and the example LLaMA (``examples.models.llama3.tiny``),
both tiny, fp32, 2 blocks, batch 8 x 16, cut between their blocks into two stages
(1F1B, 2 microbatches). The section's ``tensor_parallel`` layout is read from
plan-style parameter placements on the mesh ("pp", "dp", "tp") by
``tensor_parallel_from_params``: Megatron's column split of q/k/v and gate/up
(weight ``S(0)`` on tp), row split of o and down (``S(1)``); the example LLaMA's
attention, which reshapes with its head counts, gets them divided by tp; inside each stage torch's
``parallelize_module`` runs it, then FSDP2 shards the stage over dp (2-D parameters).
This is torch's tensor parallelism with the plan's column/row choice, not the plan's
per-op placements (``autoshard.runtime.pipeline_tp`` says what differs). After each
of two AdamW steps the loss (last stage, averaged over dp) and every gradient
(gathered over dp and tp) equal the one-device model's.
"""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import spawn, whole

from examples.models import hf, llama3

pytestmark = pytest.mark.slow

STEPS = 2
KW = {"batch_size": 8}
MESH = ((2, 2, 2), ("pp", "dp", "tp"))
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "wq", "wk", "wv", "w1", "w3")
ROW = ("o_proj", "down_proj", "wo", "w2")
MODELS = ("hf", "llama3")


def build(label: str):
    """(model, keyword inputs) of ``label``."""
    if label == "hf":
        return hf.hf_llama(**KW)
    model, (tokens, labels) = llama3.tiny(**KW)
    return model, {"tokens": tokens, "labels": labels}


def loss_of(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.loss


def plan_params(model) -> dict[str, str]:
    """Placements a plan on (pp, dp, tp) could give: FSDP's S(0) on dp, Megatron's split on tp."""
    out = {}
    for name, _ in model.named_parameters():
        module = name.rsplit(".", 2)[-2]
        tp = "S(0)" if module in COLUMN else "S(1)" if module in ROW else "R"
        out[name] = f"RS(0){tp}"
    return out


def run_tp(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", *MESH[:1], mesh_dim_names=MESH[1])
    return {label: run_model(label, mesh) for label in MODELS}


def run_model(label: str, mesh) -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts
    from autoshard.runtime.pipeline_tp import block_linears, tensor_parallel_from_params

    reference, inputs = build(label)
    model, _ = build(label)
    parts = model_parts(model)
    layout = tensor_parallel_from_params(plan_params(model), MESH[1], block_linears(model, parts.blocks))
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=8,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing, tensor_parallel=layout)
    run = build_pipeline(model, mesh, section)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(run.parameters(), lr=1e-2)
    dp = mesh["dp"]
    share = next(iter(inputs.values())).shape[0] // dp.size()
    rows = slice(dp.get_local_rank() * share, (dp.get_local_rank() + 1) * share)
    split = {n: [str(p) for p in param.placements] for n, param in run.named_parameters() if isinstance(param, DTensor)}
    steps = []
    for _ in range(STEPS):
        ref_opt.zero_grad()
        ref_loss = loss_of(reference(**inputs))
        ref_loss.backward()
        opt.zero_grad()
        loss = run.step(**{k: v[rows] for k, v in inputs.items()})
        if loss is not None:
            dist.all_reduce(loss, group=dp.get_group())
            loss = loss / dp.size()
        steps.append({"loss": loss, "ref_loss": ref_loss.detach(),
                      "grads": {n: whole(p.grad).clone() for n, p in run.named_parameters() if p.grad is not None},
                      "params": [n for n, _ in run.named_parameters()],
                      "ref_grads": {n: p.grad.clone() for n, p in reference.named_parameters()}})
        ref_opt.step()
        opt.step()
    return {"layout": dict(layout), "placements": split, "steps": steps}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(8, run_tp, (), tmp_path_factory.mktemp("pipeline-tp") / "ranks", timeout=420)


def test_layout_is_megatrons_column_then_row_split_from_the_placements(results):
    layout = results[0]["hf"]["layout"]
    assert len(layout) == 14 and len(results[0]["llama3"]["layout"]) == 14
    assert layout["model.layers.0.self_attn.q_proj"] == "colwise"
    assert layout["model.layers.1.mlp.down_proj"] == "rowwise"
    assert results[0]["llama3"]["layout"]["layers.0.attention.wo"] == "rowwise"


@pytest.mark.parametrize("label", MODELS)
def test_split_linears_are_sharded_over_dp_and_tp_and_the_rest_over_dp_only(results, label):
    for res in results:
        placements = res[label]["placements"]
        assert placements, "FSDP makes every parameter a DTensor"
        for name, p in placements.items():
            module = name.rsplit(".", 2)[-2]
            if module in COLUMN:  # dim 0 split over tp, then its tp shard over dp (torch writes it strided)
                assert len(p) == 2 and "S(0" in p[0] and p[1] == "S(0)", (name, p)
            elif module in ROW:
                assert p == ["S(0)", "S(1)"], (name, p)
            else:
                assert p == ["S(0)"], (name, p)


@pytest.mark.parametrize("label", MODELS)
def test_loss_and_every_gradient_equal_one_device_after_each_step(results, label):
    holders = 0
    for rank, res in enumerate(results):
        for step, entry in enumerate(res[label]["steps"]):
            if entry["loss"] is not None:
                holders += step == 0
                torch.testing.assert_close(entry["loss"], entry["ref_loss"], rtol=1e-5, atol=1e-6)
            assert entry["params"], f"rank {rank}: no parameters"
            assert set(entry["grads"]) == set(entry["params"]), f"rank {rank}: a gradient is missing"
            for name, grad in entry["grads"].items():
                torch.testing.assert_close(grad, entry["ref_grads"][name], rtol=1e-4, atol=1e-6,
                                           msg=lambda m, n=name, s=step: f"{label} step {s} rank {rank} {n}: {m}")
    assert holders == 4, "the loss is on the four (dp x tp) ranks of the last stage"

"""Pipeline stages from a plan's ``pipeline`` section on gloo ranks, against one device.

One spawn of 4 ranks runs every job (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble,
ZBVZeroBubble, DualPipeV): the example LLaMA (tiny, fp32) cut into stages by
``build_pipeline_section``, run by ``autoshard.runtime.pipeline_stages.build_pipeline``
with torch's schedule class, each stage FSDP-sharded (or replicated) over its dp
sub-mesh; two AdamW steps. After each step the loss (last stage, averaged over dp)
and every parameter's gradient (each stage's, gathered over dp) equal the one-device
model's on the whole batch; every parameter has a gradient on exactly one stage; the
sends each rank issued are the plan's: ``m`` activations per boundary forward, ``m``
gradients backward, each of the plan's ``send_bytes`` (none across a V-shaped schedule's turn,
where both stages are on one rank). Two jobs recompute (the section's ``recompute`` "full":
each block's forward again before its backward), 1F1B and ZBV (its split backward); on
every job each block runs its forward as often per step as the schedule's actions say
(:func:`_block_forwards`: once per microbatch, plus once per backward pass that reads it
under recomputation), so the recomputing jobs cannot pass without recomputing. One job runs what the pipeline
search chose (``search_pipeline`` over the tiny LLaMA's block pricing on the ``cpu-gloo``
profile, GPipe and 1F1B, 2 or 4 microbatches), through ``pipeline_section``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from gloo_ranks import spawn, whole

from autoshard.plan.pipeline_section import PipelineSection, build_pipeline_section
from examples.models import llama3

pytestmark = pytest.mark.slow

TINY = {"batch_size": 8}
DEEP = {"batch_size": 8, "n_layers": 8}
"""Eight blocks: four ranks x two stages each (interleaved)."""
FOUR = {"batch_size": 8, "n_layers": 4}
"""Four blocks: two ranks x two stages each (interleaved zero-bubble, and the V-shaped schedules)."""
SEQ, DIM, ITEMSIZE = 16, 64, 4
STEPS = 2


def _section(schedule: str, n_ranks: int, m: int, cuts: tuple[int, ...], kwargs: dict, v: int = 1,
             dp: int = 2, data_parallel: str = "fsdp", recompute: str = "none") -> PipelineSection:
    model, _ = llama3.tiny(device="meta", **kwargs)
    from autoshard.runtime.pipeline_stages import model_parts

    parts = model_parts(model)
    batch = kwargs["batch_size"]
    return build_pipeline_section(schedule=schedule, n_ranks=n_ranks, n_microbatches=m, batch_size=batch,
                                  block_paths=parts.blocks, cuts=cuts, leading=parts.leading, trailing=parts.trailing,
                                  stages_per_rank=v, send_bytes=batch // (m * dp) * SEQ * DIM * ITEMSIZE,
                                  data_parallel=data_parallel, recompute=recompute)


JOBS = {
    "gpipe-pp2-dp2-m2": ((2, 2), ("pp", "dp"), _section("GPipe", 2, 2, (1,), TINY), TINY),
    "1f1b-pp2-dp2-m4": ((2, 2), ("pp", "dp"), _section("1F1B", 2, 4, (1,), TINY), TINY),
    "1f1b-pp2-dp2-m2-replicate": ((2, 2), ("pp", "dp"), _section("1F1B", 2, 2, (1,), TINY,
                                                                 data_parallel="replicate"), TINY),
    "interleaved-pp4-v2-m4": ((4,), ("pp",), _section("Interleaved1F1B", 4, 4, (1, 2, 3, 4, 5, 6, 7), DEEP, v=2,
                                                     dp=1), DEEP),
    # Split backward (input gradients, then weight gradients) under FSDP: the weight pass must see the
    # gathered parameters the forward used; V-shaped: rank r holds stages r and 3 - r.
    "interleaved-zb-pp2-v2-dp2-m4": ((2, 2), ("pp", "dp"), _section("InterleavedZeroBubble", 2, 4, (1, 2, 3), FOUR,
                                                                    v=2), FOUR),
    "zbv-pp2-dp2-m4": ((2, 2), ("pp", "dp"), _section("ZBVZeroBubble", 2, 4, (1, 2, 3), FOUR, v=2), FOUR),
    "dualpipev-pp2-dp2-m4": ((2, 2), ("pp", "dp"), _section("DualPipeV", 2, 4, (1, 2, 3), FOUR, v=2), FOUR),
    "1f1b-pp2-dp2-m4-recompute": ((2, 2), ("pp", "dp"), _section("1F1B", 2, 4, (1,), TINY, recompute="full"), TINY),
    "zbv-pp2-dp2-m4-recompute": ((2, 2), ("pp", "dp"), _section("ZBVZeroBubble", 2, 4, (1, 2, 3), FOUR, v=2,
                                                                recompute="full"), FOUR),
}


SEARCHED = "searched-pp2-dp2"
SEARCHED_KW = {"batch_size": 8, "n_layers": 4}


def _searched_section() -> PipelineSection:
    from hw_profiles import load

    from autoshard.runtime.pipeline_stages import model_parts
    from autoshard.search.pipeline import PipelineLayout, pipeline_section, search_pipeline
    from autoshard.search.pipeline_blocks import price_blocks

    def price(micro_batch: int):
        return price_blocks(llama3.tiny, {"device": "meta"}, (2,), ("dp",), micro_batch=micro_batch, depths=(1, 2),
                            profile="cpu-gloo", time_limit=10)

    chosen = search_pipeline(price, n_blocks=4, batch=8, seq_len=SEQ, dim=DIM, layout=PipelineLayout(2, 2, 1),
                             profile=load("cpu-gloo"), flops_per_token=1.0, schedules=("GPipe", "1F1B"),
                             microbatches=(2, 4))
    parts = model_parts(llama3.tiny(device="meta", **SEARCHED_KW)[0])
    return pipeline_section(chosen, batch=8, seq_len=SEQ, dim=DIM, block_paths=parts.blocks, leading=parts.leading,
                            trailing=parts.trailing, itemsize=ITEMSIZE)


def run_jobs(rank: int, world: int, jobs: dict) -> dict:
    """Every job on this rank: per step the reference (one device, whole batch) and the pipeline's
    loss, gradients and sends."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts

    out = {}
    for label, (shape, names, section_dict, kwargs) in jobs.items():
        section = PipelineSection.from_dict(section_dict)
        reference, (tokens, labels) = llama3.tiny(**kwargs)
        model, _ = llama3.tiny(**kwargs)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        forwards: Counter = Counter()  # a block's first child runs in its forward and in its recomputation
        for index, path in enumerate(model_parts(model).blocks):
            first_child = next(iter(model.get_submodule(path).children()))
            first_child.register_forward_pre_hook(lambda *_, i=index: forwards.update([i]))
        run = build_pipeline(model, mesh, section, record_sends=True)
        opt = torch.optim.AdamW(run.parameters(), lr=1e-2)
        dp = mesh["dp"] if "dp" in names else None
        size, coord = (dp.size(), dp.get_local_rank()) if dp is not None else (1, 0)
        share = tokens.shape[0] // size
        rows = slice(coord * share, (coord + 1) * share)
        steps = []
        for _ in range(STEPS):
            ref_opt.zero_grad()
            ref_loss = reference(tokens, labels)
            ref_loss.backward()
            opt.zero_grad()
            forwards.clear()
            loss = run.step(tokens=tokens[rows], labels=labels[rows])
            if loss is not None and dp is not None:
                dist.all_reduce(loss, group=dp.get_group())
                loss = loss / size
            grads = {name: whole(p.grad).clone() for name, p in run.named_parameters() if p.grad is not None}
            ref_grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
            steps.append({"loss": loss, "ref_loss": ref_loss.detach(), "grads": grads, "ref_grads": ref_grads,
                          "sends": [(s.stage, s.kind, s.nbytes) for s in run.sends],
                          "block_forwards": dict(forwards),
                          "stages": [s.index for s in section.stages_of_rank(mesh[section.mesh_dim].get_local_rank())],
                          "params": [name for name, _ in run.named_parameters()],
                          "stage_params": {st.stage_index: [n for n, _ in mod.named_parameters()]
                                           for st, mod in zip(run.stages, run.stage_modules)}})
            ref_opt.step()
            opt.step()
        out[label] = steps
    return out


def spawn_jobs(world: int, jobs: dict, tmp, *, timeout: float) -> list:
    """:func:`run_jobs` of ``jobs`` (label -> (mesh shape, dim names, section, model kwargs)) on ``world``
    gloo ranks, the sections sent as their dicts: each rank's results, in rank order."""
    sent = {label: (shape, names, section.to_dict(), kwargs) for label, (shape, names, section, kwargs) in jobs.items()}
    return spawn(world, run_jobs, (sent,), tmp, timeout=timeout)


LABELS = [*JOBS, SEARCHED]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    jobs = {**JOBS, SEARCHED: ((2, 2), ("pp", "dp"), _searched_section(), SEARCHED_KW)}
    return jobs, spawn_jobs(4, jobs, tmp_path_factory.mktemp("pipeline") / "ranks", timeout=300)


@pytest.fixture(scope="module")
def results(run):
    return run[1]


@pytest.mark.parametrize("label", LABELS)
def test_loss_and_every_gradient_equal_one_device_after_each_step(results, label):
    for step in range(STEPS):
        last = [res[label][step] for res in results if res[label][step]["loss"] is not None]
        assert last, f"{label}: no rank returned the loss"
        for entry in last:
            torch.testing.assert_close(entry["loss"], entry["ref_loss"], rtol=1e-5, atol=1e-6)
        for rank, res in enumerate(results):
            entry = res[label][step]
            assert set(entry["grads"]) == set(entry["params"]), f"{label} rank {rank}: a parameter has no gradient"
            for name, grad in entry["grads"].items():
                torch.testing.assert_close(grad, entry["ref_grads"][name], rtol=1e-4, atol=1e-6,
                                           msg=lambda m, n=name: f"{label} step {step} rank {rank} {n}: {m}")


@pytest.mark.parametrize("label", LABELS)
def test_every_parameter_is_on_exactly_one_stage_where_the_plan_put_it(run, label):
    jobs, results = run
    section = jobs[label][2]
    model, _ = llama3.tiny(device="meta", **jobs[label][3])
    by_stage: dict[int, set[str]] = {}
    for res in results:
        for stage, names in res[label][0]["stage_params"].items():
            by_stage.setdefault(stage, set()).update(names)
    for name, _ in model.named_parameters():
        stages = [k for k, names in by_stage.items() if name in names]
        want = [st.index for st in section.stages if any(name.startswith(m + ".") for m in st.modules)]
        assert stages == want and len(want) == 1, f"{label}: {name} is on stages {stages}, the plan says {want}"
    assert "tok_embeddings.weight" in by_stage[0] and "output.weight" in by_stage[section.n_stages - 1]


@pytest.mark.parametrize("label", LABELS)
def test_sends_each_rank_issues_are_the_plans(run, label):
    jobs, results = run
    section = jobs[label][2]
    assert section.send_bytes > 0
    for rank, res in enumerate(results):
        for step in range(STEPS):
            entry = res[label][step]
            want = []
            for stage in entry["stages"]:
                fwd, bwd = section.planned_sends(stage)
                want += [(stage, "activation", section.send_bytes)] * fwd + [(stage, "gradient", section.send_bytes)] * bwd
            assert sorted(entry["sends"]) == sorted(want), f"{label} rank {rank} step {step}"


def _block_forwards(section: PipelineSection, stage: int) -> int:
    """How many times per step each block of ``stage`` runs its forward, from the schedule's actions:
    once per microbatch (``F``); recomputing, once more per backward call that reads the block: a
    full backward ``B``, a weight pass ``W`` (one for all its parameter groups) and an input pass
    ``I``, which torch skips on the first stage (its whole backward runs in the ``W``)."""
    from costmodel.pipeline_schedules import build_schedule

    schedule = build_schedule(section.schedule, n_ranks=section.n_ranks, n_microbatches=section.n_microbatches,
                              stages_per_rank=section.stages_per_rank)
    kinds = Counter(a.kind.value for order in schedule.orders for a in order if a.stage == stage)
    if section.recompute == "none":
        return kinds["F"]
    return kinds["F"] + kinds["B"] + kinds["W"] + (kinds["I"] if stage > 0 else 0)


@pytest.mark.parametrize("label", LABELS)
def test_each_block_runs_its_forward_as_often_as_the_schedule_and_recomputation_say(run, label):
    jobs, results = run
    section = jobs[label][2]
    for rank, res in enumerate(results):
        for step in range(1, STEPS):  # step 0 adds torch's metadata inference (a forward and backward on meta)
            entry = res[label][step]
            want = {block: _block_forwards(section, stage) for stage in entry["stages"]
                    for block in range(section.stages[stage].first_block, section.stages[stage].end_block)}
            assert entry["block_forwards"] == want, f"{label} rank {rank} step {step}"
    if section.recompute == "full":  # each block twice per microbatch at least: the forward and its recomputation
        assert min(_block_forwards(section, st.index) for st in section.stages) == 2 * section.n_microbatches

"""Sequence parallelism inside pipeline stages: 4 gloo ranks, pp 2 x tp 2, against one device.

The example LLaMA (``examples.models.llama3.tiny``) and Hugging Face's ``LlamaForCausalLM``
as given (``examples.models.hf.hf_llama``), fp32, 2 blocks, batch 8 x 16, hidden 64, cut
between their blocks into two stages (1F1B, 2 microbatches), with Megatron's column / row
split of their linears on ``tp`` (read from plan-style placements, as
``test_pipeline_tp_gloo.py`` does), run with the section's ``sequence_parallel`` (the
residual stream ``(batch, seq/tp, dim)`` on each tp rank, ``autoshard.runtime.pipeline_sp``),
and the example LLaMA once more without it (replicated over tp), all in one spawn (with a partial
section, and one whose first stage runs its block under the op-level policy). After
each of two AdamW steps the loss and every gradient equal the one-device model's; the sends
each rank records are the section's ``send_bytes`` (priced at ``1/tp`` of the activation)
with sequence parallelism, ``tp`` times that without. The sequence-parallel sections without
recomputation come from the plan's placements by ``with_plan_layout``, as a searched plan's do:
the rule that prices a stage sequence-split without recomputation too
(``pipeline_section.priced_sequence_parallel``) is the one that runs here. In every mode the
embedding and the head are split over the vocabulary on tp (``trace.blocks.vocab_split``), the
head's logits gathered whole: the example LLaMA reads its head's weight without calling the head
(``F.linear(x, self.output.weight)``), Hugging Face's model calls its ``lm_head``.
"""

from __future__ import annotations

import pytest
from equivalence import assert_pipeline_matches_one_device
from gloo_ranks import spawn
from test_pipeline_tp_gloo import build, plan_params

pytestmark = pytest.mark.slow

STEPS = 2
BATCH, SEQ, DIM, MICROBATCHES, TP = 8, 16, 64, 2, 2
MESH = ((2, 1, 2), ("pp", "dp", "tp"))  # dp of 1: every rank steps the whole batch
SP_SEND_BYTES = BATCH // MICROBATCHES * SEQ // TP * DIM * 4  # fp32 (micro_batch, seq/tp, dim)
JOBS = {"llama3_sp": ("llama3", True, "none"), "llama3_replicated": ("llama3", False, "none"),
        "hf_sp": ("hf", True, "none"), "llama3_sp_full": ("llama3", True, "full"),
        "llama3_sp_zb": ("llama3", True, "none", "InterleavedZeroBubble"),
        "llama3_sp_partial": ("llama3", True, "partial"), "llama3_sp_selective": ("llama3", True, "selective")}
PARTIAL_BLOCKS = (1, 0)
"""The ``partial`` job's checkpointed blocks per stage: the first stage's block checkpointed, the last's kept."""
SELECTIVE_BLOCKS = (1, 0)
"""The ``selective`` job (a ``partial`` section, nothing checkpointed fully): the first stage's block under
the op-level policy (``pipeline_stages.selective_blocks``), the last's kept."""
VOCAB_MODULES = {"tok_embeddings": "embedding", "embed_tokens": "embedding", "output": "head", "lm_head": "head"}
VOCAB = 256
"""Both tiny models' vocabulary; the embedding is on stage 0 (pp rank 0), the head on stage 1."""
"""label -> (model, sequence_parallel, recompute[, schedule: 1F1B]); ``build`` makes the models at batch 8 x 16. The
search runs sequence parallelism with full recomputation (what it prices split: a checkpointed
block's kept input, ``autoshard.search.pipeline_blocks`` (h'))."""


def section_of(model, sequence_parallel: bool, recompute: str = "none", schedule: str = "1F1B"):
    """The two-stage section of ``model`` with its tp layout, priced sequence-split when
    ``sequence_parallel``: without recomputation, the layout and the split as ``with_plan_layout``
    reads them from the plan's placements (module docstring)."""
    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import model_parts
    from autoshard.runtime.pipeline_tp import block_linears, tensor_parallel_from_params, with_plan_layout

    parts = model_parts(model)
    layout = tensor_parallel_from_params(plan_params(model), MESH[1], block_linears(model, parts.blocks))
    by_rule = sequence_parallel and recompute == "none"
    selective = recompute == "selective"
    recompute = "partial" if selective else recompute
    section = build_pipeline_section(schedule=schedule, n_ranks=2, n_microbatches=MICROBATCHES, batch_size=BATCH,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing, tensor_parallel=() if by_rule else layout,
                                     send_bytes=SP_SEND_BYTES if sequence_parallel else SP_SEND_BYTES * TP,
                                     sequence_parallel=sequence_parallel and not by_rule, recompute=recompute,
                                     recompute_blocks=((0, 0) if selective else PARTIAL_BLOCKS)
                                     if recompute == "partial" else (),
                                     selective_blocks=SELECTIVE_BLOCKS if selective else ())
    return with_plan_layout(section, model, plan_params(model), MESH[1]) if by_rule else section


def run_sp(rank: int, world: int) -> dict:
    """Per mode: each step's loss and gradients against one device, the sends of each step and the
    sends the section plans for this rank's stages."""
    from equivalence import pipeline_steps
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.pipeline_stages import build_pipeline

    mesh = init_device_mesh("cpu", MESH[0], mesh_dim_names=MESH[1])
    records = _count_regathers()
    out = {}
    for label, (name, sequence_parallel, recompute, *schedule) in JOBS.items():
        records.clear()
        reference, inputs = build(name)
        model, _ = build(name)
        section = section_of(model, sequence_parallel, recompute, *schedule)
        run = build_pipeline(model, mesh, section, record_sends=True)
        sends: list[list[tuple]] = []
        run_step = run.step

        def step(run_step=run_step, run=run, sends=sends, **inputs):  # keep each step's sends: the next clears them
            loss = run_step(**inputs)
            sends.append(sorted((s.stage, s.kind, s.nbytes) for s in run.sends))
            return loss

        run.step = step
        steps = pipeline_steps(run, reference, inputs, mesh["dp"], steps=STEPS)
        planned = []
        for st in section.stages_of_rank(mesh["pp"].get_local_rank()):
            fwd, bwd = section.planned_sends(st.index)
            planned += [(st.index, "activation", section.send_bytes)] * fwd
            planned += [(st.index, "gradient", section.send_bytes)] * bwd
        vocab = {VOCAB_MODULES[n.split(".")[-2]]: ([str(p) for p in param.placements], tuple(param.to_local().shape))
                 for n, param in run.named_parameters() if n.split(".")[-2] in VOCAB_MODULES}
        out[label] = {"steps": steps, "sends": sends, "planned": sorted(planned),
                      "sequence_parallel": section.sequence_parallel, "layout": len(section.tensor_parallel),
                      "vocab": vocab, "pp": mesh["pp"].get_local_rank(),
                      "regathers": [(r.packs, r.gathers) for r in records if r.packs]}
    return out


def _count_regathers() -> list:
    """The re-gather records (``pipeline_sp._Regather``) this rank makes from now on, each counting
    the backward's gathers: the run's own class, wrapped (this spawned process only)."""
    from autoshard.runtime import pipeline_sp

    made: list = []
    cls = pipeline_sp._Regather
    init, take = cls.__init__, cls.take

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.gathers = 0
        made.append(self)

    def counted_take(self):
        self.gathers += self.whole is None
        return take(self)
    cls.__init__, cls.take = counted_init, counted_take
    return made


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(4, run_sp, (), tmp_path_factory.mktemp("u4_sp") / "ranks", timeout=300)


@pytest.mark.parametrize("label", ["llama3_sp", "hf_sp", "llama3_sp_full", "llama3_sp_zb", "llama3_sp_partial",
                                   "llama3_sp_selective"])
def test_sequence_parallel_loss_and_every_gradient_equal_one_device_after_each_step(results, label):
    # the loss is on the two tp ranks of the last stage
    assert_pipeline_matches_one_device([res[label]["steps"] for res in results], holders=2, label=label)


@pytest.mark.parametrize("label", list(JOBS))
def test_the_embedding_and_the_head_are_split_over_the_vocabulary_on_tp(results, label):
    # weight (vocab, dim) Shard(0) on tp: each rank holds vocab / tp rows (the loss equality above
    # holds with it: the head's logits gathered whole)
    for res in results:
        kind = "embedding" if res[label]["pp"] == 0 else "head"
        placements, local = res[label]["vocab"][kind]
        assert placements == ["S(0)"] and local == (VOCAB // TP, DIM), (label, kind, res[label]["vocab"])


@pytest.mark.parametrize("label", ["llama3_sp", "hf_sp"])
def test_a_plans_tp_layout_without_recomputation_runs_sequence_parallel(results, label):
    # with_plan_layout gave these sections their layout (14 linears) and, without recomputation, the split
    assert all(res[label]["sequence_parallel"] and res[label]["layout"] == 14 for res in results)
    assert not any(res["llama3_replicated"]["sequence_parallel"] for res in results)


@pytest.mark.parametrize("label", ["llama3_sp", "hf_sp"])
def test_without_recomputation_the_gathered_inputs_are_kept_as_shards_and_gathered_once_again_in_the_backward(
        results, label):
    # a block on each rank, its attention and feed-forward each gathering again once in the backward,
    # per microbatch and step on the first stage (a forward with no backward after it, torch's stage
    # set-up, gathers none; the last stage backpropagates one more microbatch's worth: torch's set-up
    # there); the attention's three column linears (two in the feed-forward: w1, w3) save views of one copy
    for rank, res in enumerate(results):
        regathers, first = res[label]["regathers"], res[label]["pp"] == 0
        backpropagated = sum(gathers for _, gathers in regathers)
        assert backpropagated == 2 * MICROBATCHES * STEPS if first else backpropagated >= 2 * MICROBATCHES * STEPS, \
            (rank, regathers)
        assert sorted({packs for packs, _ in regathers}) == [2, 3], (rank, regathers)
        assert all(gathers in (0, 1) for _, gathers in regathers), (rank, regathers)
    # checkpointed blocks keep only their input: no re-gather hooks
    assert not any(res["llama3_sp_full"]["regathers"] for res in results)


def test_a_partial_section_regathers_in_its_kept_blocks_only(results):
    # the first stage checkpoints its block (its recomputation gathers again: no hooks), the last keeps
    # its block and gathers its inputs again once per microbatch and step in the backward, as (h''')
    # prices a kept block of a partial stage (pipeline_tp: regather unless the section is "full")
    for rank, res in enumerate(results):
        regathers = res["llama3_sp_partial"]["regathers"]
        if res["llama3_sp_partial"]["pp"] == 0:
            assert not regathers, (rank, regathers)
        else:
            assert sum(gathers for _, gathers in regathers) >= 2 * MICROBATCHES * STEPS, (rank, regathers)
            assert all(gathers in (0, 1) for _, gathers in regathers), (rank, regathers)


def test_a_selective_block_regathers_in_its_recomputation_not_through_hooks(results):
    # the op-level policy saves matmul and attention outputs, not the gathered inputs: its recomputation
    # gathers them again, as a checkpointed block's does (pipeline_selective prices it so); the kept block
    # of the last stage keeps its shards and re-gathers as in the partial job
    for rank, res in enumerate(results):
        regathers = res["llama3_sp_selective"]["regathers"]
        if res["llama3_sp_selective"]["pp"] == 0:
            assert not regathers, (rank, regathers)
        else:
            assert sum(gathers for _, gathers in regathers) >= 2 * MICROBATCHES * STEPS, (rank, regathers)


def test_a_split_backward_gathers_the_kept_inputs_again_once_in_each_pass_through_them(results):
    # the zero-bubble schedule's input and weight passes each rebuild the copy once, not once per linear
    # (priced in both: pipeline_blocks (h'''), pipeline._stage_costs); the first stage's input needs no
    # gradient, so its input pass reaches no block: its weight pass alone gathers
    for rank, res in enumerate(results):
        regathers, first = res["llama3_sp_zb"]["regathers"], res["llama3_sp_zb"]["pp"] == 0
        twice = sum(1 for _, gathers in regathers if gathers == 2)
        assert sum(gathers for _, gathers in regathers) == 2 * MICROBATCHES * STEPS if first \
            else twice == 2 * MICROBATCHES * STEPS, (rank, regathers)
        assert all(gathers in ((0, 1) if first else (0, 1, 2)) for _, gathers in regathers), (rank, regathers)


def test_sequence_parallel_sends_are_the_priced_send_bytes_one_tp_th_of_the_replicated_ones(results):
    for rank, res in enumerate(results):
        sp, replicated = res["llama3_sp"], res["llama3_replicated"]
        assert sp["planned"], f"rank {rank}: no stage boundary"
        assert all(nbytes == SP_SEND_BYTES for _, _, nbytes in sp["planned"])
        for step in range(STEPS):
            assert sp["sends"][step] == sp["planned"], f"rank {rank} step {step}"
            assert replicated["sends"][step] == replicated["planned"], f"rank {rank} step {step}"
            assert [n * TP for *_, n in sp["sends"][step]] == [n for *_, n in replicated["sends"][step]]

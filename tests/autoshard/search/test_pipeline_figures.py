"""What a pipeline stage's block pricing reads from two solved depths (``pipeline_blocks``).

A Hugging Face model's block state is counted per block, its embedding on the first stage.

``autoshard.search.pipeline_blocks.plan_figures`` splits a solved plan's parameter state into the
repeated blocks, the first stage's embedding and the rest. Hugging Face nests both a level down
(``model.layers.3.``, ``model.embed_tokens``): they once fell to "the rest", so a pipeline of an
HF model priced its blocks as stateless and put the embedding on the last stage.

Under full recomputation a block keeps only its input for the backward: the per-block activation
is the live memory's growth at the loss (``K``), not the peak's, which sits in the backward where
one block's recomputed activations and the gradients live (the peak's difference once priced a
405B block at 0.48 GiB a microbatch, 15 times its input).
"""

from __future__ import annotations

import importlib.util

import pytest

from autoshard.search.pipeline_blocks import plan_figures
from autoshard.search.solve import prepare, solve_prepared



def test_a_fully_recomputed_block_keeps_its_input_and_no_more() -> None:
    from examples.models import llama3

    from autoshard.search.pipeline_blocks import price_blocks

    model, _ = llama3.tiny(device="meta")
    dim, micro_batch, seq, ranks = model.tok_embeddings.weight.shape[1], 4, 64, 2
    kept = {}
    for policy in ("full", "none"):
        pricing = price_blocks(llama3.tiny, {"seq_len": seq}, (ranks,), ("dp",), micro_batch=micro_batch,
                               depths=(2, 4), recompute=policy, baseline="ddp", profile="h100-sxm-80gb",
                               time_limit=10)  # pinned: both depths lay out every block alike
        kept[policy] = pricing.block.activation_bytes
        assert all(f.forward_end_bytes > f.state_bytes for f in pricing.figures)
    assert kept["full"] == micro_batch // ranks * seq * dim * 4  # the block's fp32 input, this rank's rows
    assert kept["none"] > 10 * kept["full"]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_hf_llama_blocks_and_embedding_are_placed_where_they_live() -> None:
    from examples.models import hf

    model, inputs = hf.hf_llama(num_hidden_layers=2, device="meta")
    prep = prepare(model, inputs, (2,), ("dp",), profile="h100-sxm-80gb", recompute="none")
    plan = solve_prepared(prep, time_limit=10)
    fig = plan_figures(prep, plan, 2)
    params = dict(model.named_parameters())
    per_param = {n: p.numel() for n, p in params.items()}
    # bytes per parameter element at the plan's placements: the embedding's (first) and the rest's
    assert fig.state_bytes > 0 and fig.extra_state_first_bytes > 0
    block_elems = sum(v for n, v in per_param.items() if n.startswith("model.layers."))
    embed_elems = per_param["model.embed_tokens.weight"]
    rest_elems = sum(per_param.values()) - block_elems - embed_elems
    assert fig.extra_state_first_bytes / embed_elems == pytest.approx(fig.state_bytes / block_elems, rel=0.5)
    assert fig.extra_state_last_bytes / max(1, rest_elems) < 2 * fig.state_bytes / block_elems


def test_an_fsdp_stage_holds_its_blocks_gathered_weights_and_gradients_through_the_step() -> None:
    """A stage keeps its weights gathered from the first forward to the last backward and
    accumulates unsharded gradients (FSDP2 in a pipeline): each block's state holds both beside
    its shards, and the weight gathers are priced once a step, not in the block's time."""
    from examples.models import llama3

    from autoshard.search.pipeline_blocks import price_blocks

    pricing = price_blocks(llama3.tiny, {"seq_len": 32}, (2,), ("dp",), micro_batch=4, depths=(2, 4),
                           recompute="none", baseline="fsdp", profile="h100-sxm-80gb", time_limit=10)
    model, _ = llama3.tiny(device="meta", n_layers=1)
    block_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if n.startswith("layers."))
    lo, hi = pricing.figures
    held = (hi.held_bytes - lo.held_bytes) / (hi.n_blocks - lo.n_blocks)
    assert held == pytest.approx(2 * block_bytes, rel=0.01)  # fp32 weights and fp32 gradients, unsharded
    assert pricing.block.state_bytes >= held + block_bytes  # and the shards: weights, gradients, AdamW state
    assert pricing.block_gather_s > 0

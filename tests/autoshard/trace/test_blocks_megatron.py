"""Megatron's column / row split of a block's linears, found from their shapes (whatever they are
named), and the vocabulary split of the embedding and the head beside it: what a pipeline stage on a
``tp`` dim runs and its stage solve pins."""

from __future__ import annotations

import fnmatch

from torch import nn

from autoshard.trace.blocks import (block_linears, column_then_row, megatron_split, megatron_table,
                                    repeated_blocks, vocab_split)
from examples.models import hf, llama3


def _split_of(model: nn.Module, tp: int = 2) -> dict[str, str]:
    first = repeated_blocks(model)[:1]
    return {path.removeprefix(first[0] + "."): style
            for path, style in megatron_split(model, block_linears(model, first), tp)}


def test_hf_grouped_query_projections_pair_as_megatron_with_the_output_projections_split_by_rows() -> None:
    model, _ = hf.hf_llama(device="meta")  # 4 query heads, 2 K/V heads: k/v narrower than q
    split = _split_of(model)
    assert split == {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                     "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                     "mlp.down_proj": "rowwise"}
    linears = block_linears(model, repeated_blocks(model))
    styles = dict(megatron_split(model, linears, 2))
    assert len(styles) == len(linears) and column_then_row(model, linears, styles)


def test_the_example_llamas_row_projection_is_found_by_shape_though_registered_between_the_columns() -> None:
    model, _ = llama3.tiny(device="meta")  # feed_forward registers w1, w2, w3
    split = _split_of(model)
    assert split["feed_forward.w2"] == split["attention.wo"] == "rowwise"
    assert {k for k, v in split.items() if v == "colwise"} == {"attention.wq", "attention.wk", "attention.wv",
                                                              "feed_forward.w1", "feed_forward.w3"}


def test_square_projections_take_the_last_registered_as_the_row_one() -> None:
    model, _ = hf.hf_llama(device="meta", num_key_value_heads=4)  # q, k, v, o all 64 x 64
    split = _split_of(model)
    assert split["self_attn.o_proj"] == "rowwise"
    assert [k for k, v in split.items() if v == "rowwise"] == ["self_attn.o_proj", "mlp.down_proj"]


def test_an_attention_whose_kv_heads_do_not_split_over_tp_is_left_replicated_and_its_mlp_still_split() -> None:
    model, _ = hf.hf_llama(device="meta", num_key_value_heads=1)  # one K/V head of 16 features
    assert _split_of(model, tp=4) == {"mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                                      "mlp.down_proj": "rowwise"}
    assert "self_attn.k_proj" in _split_of(model, tp=1)  # one rank: every head is whole
    linears = block_linears(model, repeated_blocks(model))
    assert column_then_row(model, linears, dict(megatron_split(model, linears, 4)))


def test_a_lone_linear_or_linears_that_do_not_chain_are_left_out() -> None:
    block = nn.Module()
    block.router = nn.Module()
    block.router.gate = nn.Linear(8, 4)  # one linear: nothing to pair it with
    block.heads = nn.Module()
    block.heads.a, block.heads.b = nn.Linear(8, 4), nn.Linear(8, 4)  # both read the stream, none writes it
    assert megatron_split(block, ["router.gate", "heads.a", "heads.b"], 2) == ()


def test_the_table_names_every_blocks_linears_with_column_biases_split_and_row_biases_replicated() -> None:
    model, _ = hf.hf_llama(device="meta", attention_bias=True, num_hidden_layers=3)
    table = megatron_table(model, repeated_blocks(model), 2)
    kinds = {name: next((kind for pattern, kind in table.items() if fnmatch.fnmatchcase(name, pattern)), None)
             for name, _ in model.named_parameters()}
    for i in range(3):
        assert kinds[f"model.layers.{i}.self_attn.q_proj.weight"] == kinds[f"model.layers.{i}.self_attn.k_proj.bias"] \
            == kinds[f"model.layers.{i}.mlp.up_proj.weight"] == "col"
        assert kinds[f"model.layers.{i}.self_attn.o_proj.weight"] == kinds[f"model.layers.{i}.mlp.down_proj.weight"] \
            == "row"
        assert kinds[f"model.layers.{i}.self_attn.o_proj.bias"] is None  # added once after the reduction
        assert kinds[f"model.layers.{i}.input_layernorm.weight"] is None
    # the embedding and the head split over the vocabulary (vocab_split), the final norm replicated
    assert kinds["model.embed_tokens.weight"] == kinds["lm_head.weight"] == "col"
    assert kinds["model.norm.weight"] is None


def test_the_vocabulary_split_is_the_embedding_before_and_the_linear_head_after_the_blocks_tp_divides() -> None:
    model, _ = hf.hf_llama(device="meta")  # vocab 256
    blocks = repeated_blocks(model)
    assert vocab_split(model, blocks, 2) == (("model.embed_tokens", "embedding"), ("lm_head", "head"))
    assert vocab_split(model, blocks, 3) == () and vocab_split(model, blocks, 1) == ()
    lone = nn.Sequential(nn.Embedding(8, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), nn.Linear(4, 8))
    assert vocab_split(lone, ("1.0", "1.1"), 2) == (("0", "embedding"), ("2", "head"))
    assert megatron_table(lone, ("1.0", "1.1"), 2) == {}  # no split of the blocks: none of the vocabulary either
    lone[2].weight = lone[0].weight  # a head tied to the embedding: splitting one would untie them
    assert vocab_split(lone, ("1.0", "1.1"), 2) == ()

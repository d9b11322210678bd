"""A pipeline stage's solve on a ``tp`` dim prices the split the stage runtime runs: Megatron's
column / row split of the blocks' linears pinned (``autoshard.search.pipeline_model``, A ``tp``
dim), every matmul reading its weight as placed on ``tp`` (``autoshard.search.baselines``
``tensor_parallel_reads``), as torch's ``ColwiseParallel`` / ``RowwiseParallel`` run them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from autoshard.plan.pipeline_section import PipelineError
from autoshard.search.pipeline_model import choose_pipeline
from autoshard.trace.blocks import megatron_table, repeated_blocks
from examples.models import hf


def _block_weight_reads(graph, table, *, blocks_only: bool = True) -> set[str]:
    """Names of the block weights split on tp and of their views (what a TP runtime never gathers).
    The table's block rows are its patterns; its exact names, the embedding and the head (the
    vocabulary split), count with ``blocks_only=False``."""
    import fnmatch

    from autoshard.graph.liveness import is_view_name

    split = [i for fqn, i in graph.params.items()
             if any(fnmatch.fnmatchcase(fqn, p) for p in table if "*" in p or not blocks_only)]
    names, frontier = set(), list(split)
    while frontier:
        i = frontier.pop()
        names.add(graph.nodes[i].name)
        frontier += [e.dst for e in graph.edges if e.src == i and is_view_name(graph.nodes[e.dst].target)]
    return names


@pytest.fixture(scope="module")
def hf_stage():
    from autoshard.search.solve import prepare

    model, inputs = hf.hf_llama(batch_size=2)
    return model, prepare(model, inputs, (2,), ("tp",), profile="cpu-gloo", recompute="none")


def test_the_pinned_stage_solve_multiplies_each_weight_shard_where_it_lies(hf_stage) -> None:
    from autoshard.search.solve import solve_prepared

    model, prep = hf_stage
    table = megatron_table(model, repeated_blocks(model), 2)
    plan = solve_prepared(prep, baseline="tp", tp_table=table, recompute="none", memory_limit=math.inf,
                          time_limit=10)
    weights = _block_weight_reads(prep.graph, table)
    assert not [r for r in plan.redistributions if r.tensor in weights], "a tp-split weight was gathered"
    # the blocks' forward matmuls come first in graph order (the head's after them)
    forward = [n for n in plan.nodes if n.op == "aten.mm.default"][:2 * 7]
    column = [n for n in forward if (n.inputs, n.out) == (("R", "S(1)"), ("S(1)",))]
    row = [n for n in forward if (n.inputs, n.out) == (("S(1)", "S(0)"), ("P(sum)",))]
    # per block: q, k, v, gate, up read the whole stream; o and down their input's shard
    assert (len(column), len(row)) == (2 * 5, 2 * 2)


def test_each_matmul_reading_a_split_weight_may_read_it_only_as_it_lies_on_tp(hf_stage) -> None:
    from costmodel.placements import Shard

    from autoshard.search.baselines import baseline_pins, tensor_parallel_reads

    model, prep = hf_stage
    graph = prep.graph
    table = megatron_table(model, repeated_blocks(model), 2)
    reads = tensor_parallel_reads(graph, baseline_pins(graph, "tp", table))
    weights = _block_weight_reads(graph, table, blocks_only=False)
    matmuls = 0
    for i, mask in reads.items():
        node = graph.nodes[i]
        if node.target != "aten.mm.default":
            continue
        matmuls += 1
        at = next(e.dst_input for e in graph.edges if e.dst == i and graph.nodes[e.src].name in weights)
        allowed = {str(s.input_placements[at][0]) for s, ok in zip(node.strategies, mask) if ok}
        refused = {str(s.input_placements[at][0]) for s, ok in zip(node.strategies, mask) if not ok}
        assert len(allowed) == 1 and isinstance(next(s.input_placements[at][0] for s, ok in
                                                     zip(node.strategies, mask) if ok), Shard)
        assert refused and not refused & allowed
    # forward and input-gradient matmuls of 7 linears in each of 2 blocks, and of the head (split
    # over the vocabulary); the embedding's lookup is no matmul
    assert matmuls == 2 * 7 * 2 + 2


class _Lone(nn.Module):
    """Blocks of one linear each: nothing for a column split to pair with."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def test_a_tp_dim_over_blocks_without_a_megatron_split_is_refused_in_one_line() -> None:
    model = _Lone()
    with pytest.raises(PipelineError, match="no Megatron column/row split") as info:
        choose_pipeline(model, (torch.randn(4, 8),), (2, 2), ("pp", "tp"), block_paths=repeated_blocks(model))
    assert "\n" not in str(info.value)

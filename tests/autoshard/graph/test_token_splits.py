"""Ops on flattened batch x sequence tokens read the strided row shard that the flatten makes."""

from __future__ import annotations

import pytest
import torch

from costmodel.placements import Shard, StridedShard
from autoshard.graph.token_splits import factors_signature, token_split_factors
from autoshard.rules import load_rules
from autoshard.rules.core import OpStrategy
from autoshard.validation.validator import MeshCase, validate_rule
from benchmarks.common.models import load as load_model

aten = torch.ops.aten
ROWS = StridedShard(0, 4)


def _made(*placements) -> OpStrategy:
    return OpStrategy((tuple(placements),), ((Shard(1),) * len(placements),))


def test_factors_come_from_token_rows_only() -> None:
    flat = _made(ROWS, Shard(1))            # [B*S, D] from a sequence split: rows strided
    heads = _made(StridedShard(2, 32))      # heads merged into the hidden dim: not token rows
    assert token_split_factors([(0, (flat, heads), 0)]) == (4,)
    assert token_split_factors([(0, (heads,), 0), (1, (_made(Shard(0)),), 0)]) == ()


def test_factors_read_the_output_the_op_reads_and_scan_a_producer_once() -> None:
    two_outputs = OpStrategy(((Shard(0),), (ROWS,)), ())
    memo: dict = {}
    assert token_split_factors([(7, (two_outputs,), 0)], memo) == ()
    assert token_split_factors([(7, (two_outputs,), 1)], memo) == (4,)
    memo[(7, 1)] = {8}  # a remembered producer is not scanned again
    assert token_split_factors([(7, (two_outputs,), 1)], memo) == (8,)


def test_signature_changes_only_with_factors() -> None:
    assert factors_signature(()) == ""
    assert factors_signature((2, 4)) == "|sf=2,4"


@pytest.mark.parametrize("op", [aten.mm.default, aten._log_softmax.default, aten._log_softmax_backward_data.default,
                                aten.nll_loss_forward.default, aten.nll_loss_backward.default])
def test_token_row_ops_hold_on_strided_rows_of_two_mesh_dims(op) -> None:
    # the 8x8 case: the rows strided on both mesh dims (_S(0,sf=B)_S(0,sf=B))
    rule = load_rules().rule_for(op)
    report = validate_rule(rule, cases=2, max_strategies=10_000,  # every strategy, the strided pairs among them
                           mesh_cases=(MeshCase((2, 2), (4, 8), strided_factors=(2,)),))
    assert report.strategies_checked > 0 and not report.failures, report.failures[:2]


@pytest.fixture(scope="module")
def batch_two_graph():
    from autoshard.search.solve import prepare

    model, inputs = load_model("llama3.tiny", {"n_layers": 1})
    return prepare(model, inputs, (4,), ("dp",), profile="a100-sxm-80gb", device_type="cpu",
                   recompute="none").graph


def _reads_strided_rows(node) -> bool:
    return any(ps is not None and StridedShard(0, 2) in ps for s in node.strategies for ps in s.input_placements)


def test_linear_layers_and_loss_of_two_sequences_on_four_ranks_read_strided_rows(batch_two_graph) -> None:
    by_target: dict[str, list] = {}
    for node in batch_two_graph.nodes:
        by_target.setdefault(node.target, []).append(node)
    for target in ("aten.mm.default", "aten._log_softmax.default", "aten.nll_loss_forward.default",
                   "aten.nll_loss_backward.default", "aten._log_softmax_backward_data.default"):
        assert any(_reads_strided_rows(n) for n in by_target[target]), target
    # the tokens are never flattened before the embedding: it is offered no strided rows
    assert not any(_reads_strided_rows(n) for n in by_target["aten.embedding.default"])
    assert all("|sf=2" in n.signature for n in by_target["aten._log_softmax.default"])

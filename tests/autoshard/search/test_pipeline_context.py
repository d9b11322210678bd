"""A pipeline stage whose sub-mesh splits the sequence (``benchmarks.pipeline_runs``, the Llama 3
long-context row, issue 56): the stage solved with the ``fsdp+tp`` parameter pins and the inputs
pinned along the sequence on ``cp`` runs every attention node, forward and backward, as the
balanced CP exchange on the ``cp`` mesh dim (K/V gathered inside it or, whole-K/V kind, by the graph
before it), with the parameters as pinned.

The tiny LLaMA (one layer, one sequence of 16 tokens) on the sub-mesh ``dp x cp x tp = 1 x 2 x 2``
of the H100 profile: small enough to build three graphs (two seeds and the stage) in seconds.
"""

from __future__ import annotations

import pytest

from benchmarks.pipeline_context import BALANCED_KINDS, balanced_context_only, context_stage
from examples.models import llama3


def _tiny(**overrides):
    return llama3.tiny(device="meta", dtype="bfloat16", seq_len=16, **overrides)


def test_a_cp_stage_runs_each_attention_as_the_balanced_exchange_on_cp_with_fsdp_tp_weights() -> None:
    _, plan = context_stage(_tiny, (1, 2, 2), depth=1, micro_batch=1, recompute="full", profile="h100-sxm-80gb",
                            time_limit=2)
    attention = [n for n in plan.nodes if "scaled_dot_product" in n.op]
    assert len(attention) == 2  # one layer: forward and backward
    assert all(n.exchange in {(kind, 1) for kind in BALANCED_KINDS} for n in attention), [n.exchange for n in attention]
    # fsdp+tp: a column weight split on its output dim over tp, FSDP over cp on the dim tp leaves whole
    assert plan.params["layers.0.attention.wq.weight"] == "RS(1)S(0)"
    assert plan.params["layers.0.attention.wo.weight"] == "RS(0)S(1)"


def test_the_cp_restriction_refuses_an_attention_it_cannot_split_rather_than_price_no_cp() -> None:
    class Node:
        name, target = "sdpa", "aten._scaled_dot_product_flash_attention.default"

    class Local:
        exchange = None

    with pytest.raises(ValueError, match="no balanced context-parallel strategy on mesh dim 1"):
        balanced_context_only(1)(Node(), (Local(),))


def test_with_dp_the_matmul_rows_map_back_to_batch_on_dp_and_sequence_on_cp() -> None:
    # the seeds of the cp x tp search run at one dp rank's batch: at the whole batch (2 sequences over cp 2) they
    # allow only a strided split of the flattened rows, and the 3-D solve re-laid every matmul's output instead
    _, plan = context_stage(_tiny, (2, 2, 2), depth=1, micro_batch=2, recompute="full", profile="h100-sxm-80gb",
                            time_limit=2)
    unflatten = [(n.inputs[0], n.out[0]) for n in plan.nodes if n.op == "aten._unsafe_view.default"]
    assert ("S(0)S(0)S(1)", "S(0)S(1)S(2)") in unflatten, unflatten
    assert not any(out[4:8] == "S(2)" for _, out in unflatten), unflatten  # no hidden dim split on cp

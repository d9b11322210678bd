"""The solve splits attention along the sequence (context parallelism) where it pays.

The example LLaMA with two heads (dim 128) and batch 1 on a 2x2 H100 mesh
(h100-sxm-80gb, fp32): the heads split one mesh dim, the batch splits none, so
without a sequence split every rank of the other dim computes the whole
attention again. At 16,384 tokens attention is most of the step and the K/V
all-gather of a 2-rank group (8 MiB per layer) is cheap beside half of it: the
solve picks a context-parallel exchange for every attention node, forward and
backward, on one mesh dim. At 256 tokens the gather's latency costs more than
the attention it saves, and no exchange is chosen.
"""

from __future__ import annotations

from autoshard.plan.explain import explain_text
from autoshard.plan.format import Plan
from autoshard.rules.context_parallel import KINDS
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3

SOLVE = {"profile": "h100-sxm-80gb", "device_type": "cpu", "time_limit": 10, "recompute": "none"}


def _solve(seq: int) -> Plan:
    model, inputs = llama3.tiny(device="meta", batch_size=1, seq_len=seq, max_seq_len=seq, dim=128, n_heads=2,
                                n_kv_heads=2)
    return solve_prepared(prepare(model, inputs, (2, 2), ("dp", "cp"), **SOLVE), time_limit=10)


def _attention(plan: Plan) -> list:
    return [n for n in plan.nodes if "scaled_dot_product" in n.op]


def test_long_sequence_on_one_sequence_splits_attention_along_it() -> None:
    plan = Plan.from_dict(_solve(16384).to_dict())  # the exchange survives the plan file
    nodes = _attention(plan)
    assert len(nodes) == 4  # two layers, forward and backward
    assert all(n.exchange is not None and n.exchange[0] in KINDS for n in nodes)
    assert len({n.exchange[1] for n in nodes}) == 1  # one CP mesh dim
    dim = nodes[0].exchange[1]
    assert all(n.inputs[0][2 * dim:2 * dim + 4] == "S(2)" for n in nodes)  # the sequence on the CP dim
    text = explain_text(plan)
    assert "context parallel: 4 attention ops split along the sequence" in text
    assert f"| {nodes[0].exchange[0]} | {dim} ({('dp', 'cp')[dim]}) | 2 |" in text


def test_short_sequence_offers_the_split_and_keeps_attention_local() -> None:
    model, inputs = llama3.tiny(device="meta", batch_size=1, seq_len=256, max_seq_len=256, dim=128, n_heads=2,
                                n_kv_heads=2)
    prep = prepare(model, inputs, (2, 2), ("dp", "cp"), **SOLVE)
    node = next(n for n in prep.graph.nodes if n.target.endswith("flash_attention_for_cpu.default"))
    assert any(s.exchange is not None for s in node.strategies)  # offered, and priced above the local ones
    plan = solve_prepared(prep, time_limit=10)
    assert all(n.exchange is None for n in _attention(plan))
    assert "context parallel" not in explain_text(plan)

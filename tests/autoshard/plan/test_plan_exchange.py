"""A plan node's optional exchange: written only where a strategy has one, read back, bad input named."""

from __future__ import annotations

import pytest

from autoshard.plan.format import PlanError, PlanNode


def test_a_local_op_writes_no_exchange_and_an_expert_parallel_one_round_trips() -> None:
    local = PlanNode("mm", "aten.mm.default", ("S(0)",), ("S(0)", "R"))
    assert "exchange" not in local.to_dict()
    assert PlanNode.from_dict(local.to_dict(), "nodes[0]") == local
    ep = PlanNode("experts", "autoshard.experts.default", ("S(0)",), ("S(0)",) * 5, "model.layers.0",
                  ("expert_dispatch", 1))
    data = ep.to_dict()
    assert data["exchange"] == {"kind": "expert_dispatch", "mesh_dim": 1}
    assert PlanNode.from_dict(data, "nodes[3]") == ep


@pytest.mark.parametrize("exchange", [{"kind": "teleport", "mesh_dim": 0}, {"kind": "expert_dispatch"},
                                      {"kind": "expert_dispatch", "mesh_dim": -1}, "expert_dispatch"])
def test_a_bad_exchange_is_one_line_naming_the_field(exchange) -> None:
    data = {"name": "experts", "op": "autoshard.experts.default", "out": "S(0)", "in": ["S(0)"] * 5,
            "exchange": exchange}
    with pytest.raises(PlanError, match=r"^nodes\[2\]\.exchange: expected \{kind: one of expert_dispatch") as info:
        PlanNode.from_dict(data, "nodes[2]")
    assert "\n" not in str(info.value)

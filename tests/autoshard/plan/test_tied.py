"""Tied parameters (input embedding = output projection) get one placement."""

from __future__ import annotations

import pytest

from autoshard.search.solve import prepare, solve_prepared


def test_tied_embedding_gets_one_placement_under_every_name() -> None:
    hf = pytest.importorskip("examples.models.hf", exc_type=ImportError)
    model, inputs = hf.hf_gpt2(device="meta")
    names = dict(model.named_parameters(remove_duplicate=False))
    assert names["lm_head.weight"] is names["transformer.wte.weight"]
    prep = prepare(model, inputs, (2,), profile="h100-sxm-80gb")
    plan = solve_prepared(prep, time_limit=30, pins={"transformer.wte.weight": "S(1)"})
    assert plan.params["lm_head.weight"] == plan.params["transformer.wte.weight"] == "S(1)"
    assert "lm_head.weight" in plan.param_aliases["transformer.wte.weight"]
    # one gradient sink for the shared parameter
    assert sum(1 for n in prep.graph.nodes if n.kind == "grad" and "wte" in n.target) == 1

"""Liveness: views own no memory, forward activations live into the backward."""

from __future__ import annotations

from autoshard.graph.liveness import compute_liveness, is_view_op


def test_views_own_no_storage_and_extend_their_base(traced_tiny) -> None:
    traced = traced_tiny("mlp")
    live = compute_liveness(traced.graph_module)
    views = [n for n in traced.graph_module.graph.nodes if n.op == "call_function" and is_view_op(n.target)]
    assert views
    for view in views:
        base = live.owner[view.name]
        assert base != view.name and view.name not in live.intervals
        last_reader = max((live.time[u.name] for u in view.users if u.op != "output"), default=live.time[view.name])
        assert live.intervals[base][1] > last_reader


def test_forward_activation_saved_for_backward_lives_into_backward(traced_tiny) -> None:
    traced = traced_tiny("mlp")
    live = compute_liveness(traced.graph_module)
    loss_time = live.time[traced.loss.name]
    saved = [name for name, (start, end) in live.intervals.items() if start < loss_time < end - 1
             and not name.startswith(("primals", "tangents"))]
    assert saved, "some forward activation must be read by the backward"


def test_outputs_kept_to_the_end_when_asked(traced_tiny) -> None:
    traced = traced_tiny("mlp")
    live = compute_liveness(traced.graph_module, outputs_live_to_end=frozenset({traced.loss.name}))
    assert live.intervals[live.owner[traced.loss.name]][1] == live.end + 1

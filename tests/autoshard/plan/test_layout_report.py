"""The rows of a mesh search: JSON round trip, the Pareto front (against brute
force), the table ``autoshard explain`` prints and the plot it draws."""

from __future__ import annotations

import random

import pytest

from autoshard.plan.layout_report import LayoutResult, layouts_table, pareto_front, plot_layouts, search_rows


def _rows(seed: int, n: int) -> list[LayoutResult]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        outcome = rng.choice(["solved", "solved", "solved", "cut", "no_fit"])
        solved = outcome == "solved"
        out.append(LayoutResult((i + 1, 2), ("dp", "tp"), outcome,
                                step_s=rng.choice([1.0, 2.0, 3.0]) if solved else None,
                                peak_memory_bytes=rng.choice([10.0, 20.0, 30.0]) if solved else None,
                                bound_s=rng.random()))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_is_what_no_other_solved_layout_dominates(seed: int) -> None:
    rows = _rows(seed, 9)
    solved = [r for r in rows if r.outcome == "solved"]

    def dominated(r: LayoutResult) -> bool:
        return any(o.step_s <= r.step_s and o.peak_memory_bytes <= r.peak_memory_bytes
                   and (o.step_s, o.peak_memory_bytes) != (r.step_s, r.peak_memory_bytes) for o in solved)

    front = pareto_front(rows)
    points = {(r.step_s, r.peak_memory_bytes) for r in front}
    assert points == {(r.step_s, r.peak_memory_bytes) for r in solved if not dominated(r)}
    assert len(points) == len(front), "each point once"
    assert [r.step_s for r in front] == sorted(r.step_s for r in front)


def test_rows_round_trip_through_plan_options() -> None:
    rows = _rows(3, 5) + [LayoutResult((2, 2, 2), ("dp_replicate", "dp_shard", "tp"), "error", reason="pin",
                                       cached=True, seconds=1.5, portfolio="fsdp", solver_status="timeout")]
    options = {"mesh_search": {"devices": 8, "devices_per_node": 8, "layouts": [r.to_dict() for r in rows]}}
    assert search_rows(options) == rows
    assert search_rows({}) == []
    with pytest.raises(ValueError, match="outcome"):
        LayoutResult((8,), ("dp",), "won")


def test_table_has_a_row_per_layout_and_marks_the_chosen_one() -> None:
    rows = [LayoutResult((8,), ("dp",), "cut", bound_s=0.5, reason="bound 500.000 ms >= best 300.000 ms"),
            LayoutResult((2, 4), ("dp", "tp"), "solved", step_s=0.3, peak_memory_bytes=2**30, bound_s=0.2,
                         solver_status="optimal", chosen=True),
            LayoutResult((4, 2), ("dp", "tp"), "no_fit", bound_s=0.25, reason="memory limit")]
    lines = layouts_table({"mesh_search": {"devices": 8, "devices_per_node": 8, "seconds": 2.0,
                                           "layouts": [r.to_dict() for r in rows]}})
    text = "\n".join(lines)
    assert "3 layouts, 1 solved, 1 cut, 1 no fit" in text
    assert "| 2x4 **chosen** | dp,tp | solved | 300.000 | 200.000 | 1.00 GiB | optimal |" in text
    assert "| 8 | dp | cut | - | 500.000 |" in text and "bound 500.000 ms >= best" in text
    assert layouts_table({}) == []


def test_plot_is_a_png_written_atomically(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = [LayoutResult((8,), ("dp",), "solved", step_s=0.4, peak_memory_bytes=3e9),
            LayoutResult((2, 4), ("dp", "tp"), "solved", step_s=0.3, peak_memory_bytes=5e9, chosen=True),
            LayoutResult((4, 2), ("dp", "tp"), "cut", bound_s=0.5)]
    options = {"mesh_search": {"devices": 8, "devices_per_node": 8, "layouts": [r.to_dict() for r in rows]}}
    out = tmp_path / "layouts.png"
    plot_layouts(options, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layouts.png"]
    with pytest.raises(ValueError, match="no solved layouts"):
        plot_layouts({}, str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()

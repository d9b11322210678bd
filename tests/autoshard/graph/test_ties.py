"""Repeated-layer detection and the union-find that keeps tie groups disjoint."""

from __future__ import annotations

from autoshard.graph.ties import UnionFind, repeated_groups
from autoshard.trace import trace_joint
from examples.models import mlp


def test_each_op_of_a_middle_layer_has_a_twin_in_the_other_middle_layers() -> None:
    traced = trace_joint(*mlp.tiny(device="meta", n_layers=6))

    def signature(node) -> str:  # placeholders by shape only: their names differ per layer
        target = node.target if node.op == "call_function" else ""
        return f"{node.op}|{target}|{getattr(node.meta.get('val'), 'shape', '')}"

    groups = repeated_groups(traced.graph_module, signature)
    by_param = {node.name: fqn for fqn, node in traced.params.items()}
    tied_params = [sorted(by_param[m] for m in g if m in by_param) for g in groups]
    # the w1 weights of the middle layers (away from the ends) are one group
    w1 = next(g for g in tied_params if any(name.endswith("2.w1.weight") for name in g))
    assert {"layers.2.w1.weight", "layers.3.w1.weight"} <= set(w1)
    assert all(len(g) >= 2 for g in groups)


def test_union_find_groups_are_disjoint_and_sorted() -> None:
    uf = UnionFind(6)
    uf.union(4, 1)
    uf.union(1, 5)
    uf.union(0, 2)
    assert uf.groups() == [[0, 2], [1, 4, 5]]

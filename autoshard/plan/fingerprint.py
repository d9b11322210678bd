"""A plan's fingerprint: which graph, mesh, profile, torch and autoshard it was solved for.

The runtime refuses a plan whose fingerprint does not match what it holds
(``autoshard.plan.format.Plan.check``); this module computes the graph part from
a trace, so the planner and every rank compute it the same way.

>>> # fp = make_fingerprint(traced, (2, 2), ("dp", "tp"), profile)
"""

from __future__ import annotations

import hashlib

import torch

from hw_profiles import HardwareProfile

from autoshard.plan.format import Fingerprint
from autoshard.trace import TracedGraph
from autoshard.version import __version__

__all__ = ["graph_hash", "make_fingerprint"]


def graph_hash(traced: TracedGraph) -> str:
    """``sha256:<hex>`` of the joint graph's code and its inputs' names, shapes and
    dtypes: equal for the same model, inputs and torch, different otherwise.
    Tensor constants add their name, shape and dtype (not their values: a plan
    does not depend on them); a graph without constants hashes as before."""
    h = hashlib.sha256(traced.graph_module.code.encode())
    for node in traced.graph_module.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            desc = node.meta.get("desc")
            h.update(f"{node.name}|{getattr(desc, 'target', '')}|{tuple(val.shape)}|{val.dtype}\n".encode())
        elif node.op == "get_attr" and isinstance(node.meta.get("val"), torch.Tensor):
            val = node.meta["val"]
            h.update(f"constant {node.target}|{tuple(val.shape)}|{val.dtype}\n".encode())
    for fqn in sorted(traced.params):
        h.update(f"param {fqn}\n".encode())
    return "sha256:" + h.hexdigest()


def make_fingerprint(traced: TracedGraph, mesh_shape: tuple[int, ...], dim_names: tuple[str, ...],
                     profile: HardwareProfile) -> Fingerprint:
    """The fingerprint a plan for ``traced`` on this mesh and profile carries."""
    return Fingerprint(graph_hash(traced), tuple(mesh_shape), tuple(dim_names), profile.fingerprint,
                       torch.__version__.split("+")[0], __version__)

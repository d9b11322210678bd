"""Recomputation policies: who decides which forward values are recomputed (torch-free).

``auto`` (the default) leaves every state to the solver, with the
placements. The others are the policies users run today, expressed as a
*restriction of the state*, not of the placement: a strategy whose state the
policy does not allow gets an infinite cost (``to_problem``), and the solver
still picks the best placements under it.

- ``none``: every closure member ``KEEP`` (the plan runs without recomputation).
- ``full`` (torchtitan's ``full``, ``torch.utils.checkpoint`` around every
  block): every member that can be recomputed is; the others (region
  outputs, unreplayable ops) are kept or held for the recomputation.
- ``selective`` (torchtitan's op-level policy, ``_save_list``): the outputs of
  ``aten.mm`` are saved except every second one of a block (counted in forward
  order: the 2nd, 4th, ... are recomputed), the outputs of scaled-dot-product
  attention are saved; everything else is recomputed. Saved means ``KEEP``,
  or ``HOLD`` for a value only the recomputation reads. torchtitan also saves
  the outputs of tensor-parallel ``reduce_scatter`` collectives; here a
  recomputed op re-runs the redistributions of its inputs, whatever they are.
- ``selective_all_mm``: ``selective`` without the every-second-``mm`` rule: the
  outputs of every ``aten.mm`` and of attention saved, the rest recomputed. It
  keeps more than ``selective`` and recomputes less (a block's largest
  matmuls are no longer run twice): the step between ``selective`` and
  ``none`` that a pipeline stage's blocks may take
  (``autoshard.search.pipeline_selective``).
- ``every:K`` (torchtitan's layer-frequency policy ``selective_ac_option=K``):
  ``full`` for every K-th block (blocks K, 2K, ... counted from 1), ``none``
  for the others. The blocks then differ, so repeated-layer ties are split by
  block class.

>>> parse_policy("every:2"), parse_policy("selective"), parse_policy("selective_all_mm")
('every:2', 'selective', 'selective_all_mm')
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoshard.graph.states import HOLD, KEEP, RECOMPUTE, strategy_states

__all__ = ["POLICIES", "OP_LEVEL_POLICIES", "PolicyError", "parse_policy", "policy_masks", "policy_ties", "region_policy"]

POLICIES = ("auto", "none", "full", "selective", "selective_all_mm")
"""Named policies; ``every:K`` (K >= 2) is the layer-frequency one."""

OP_LEVEL_POLICIES = ("selective", "selective_all_mm")
"""The policies that save some ops' outputs of a checkpointed block (the rest recomputed)."""

_MM = "aten.mm.default"
_SDPA_PREFIX = "aten._scaled_dot_product_"


class PolicyError(ValueError):
    """An unknown recomputation policy (the message names the value and the choices)."""


def parse_policy(text: str) -> str:
    """``text`` if it names a policy (module docstring), else :class:`PolicyError`."""
    if text in POLICIES:
        return text
    if isinstance(text, str) and text.startswith("every:"):
        k = text.split(":", 1)[1]
        if k.isdigit() and int(k) >= 2:
            return f"every:{int(k)}"
    raise PolicyError(f"recompute: unknown policy {text!r} (expected one of {', '.join(POLICIES)}, or every:K "
                      "with K >= 2)")


def region_policy(policy: str, region: int) -> str:
    """The policy block ``region`` (0-based) follows: ``every:K`` becomes ``full`` or ``none``."""
    if policy.startswith("every:"):
        k = int(policy.split(":", 1)[1])
        return "full" if (region + 1) % k == 0 else "none"
    return policy


def _saved_by_selective(graph: object, every_mm: bool = False) -> set[int]:
    """Op nodes whose output torchtitan's op-level policy saves: odd-numbered mm of each block (every mm
    with ``every_mm``: ``selective_all_mm``), attention."""
    counts: dict[int, int] = {}
    saved = set()
    for i, node in enumerate(graph.nodes):  # type: ignore[attr-defined]
        if node.kind != "op" or node.region < 0:
            continue
        if node.target == _MM:
            counts[node.region] = counts.get(node.region, 0) + 1
            if every_mm or counts[node.region] % 2 == 1:
                saved.add(i)
        elif node.target.startswith(_SDPA_PREFIX):
            saved.add(i)
    return saved


def policy_masks(graph: object, policy: str) -> dict[int, np.ndarray]:
    """Node index -> allowed strategies, for every op node with states whose
    policy restricts them (none for ``auto``)."""
    policy = parse_policy(policy)
    if policy == "auto":
        return {}
    every_mm = policy == "selective_all_mm"
    saved = _saved_by_selective(graph, every_mm) if policy in OP_LEVEL_POLICIES else set()
    nodes = graph.nodes  # type: ignore[attr-defined]
    allowed_states: dict[int, set[int]] = {}
    for i, node in enumerate(nodes):
        if node.kind != "op" or not node.states:
            continue
        rule = region_policy(policy, node.region)
        if RECOMPUTE not in node.states:  # held for another block's recomputation: the solver decides
            allowed = {KEEP} if policy == "none" else {KEEP, HOLD}
        elif rule == "none":
            allowed = {KEEP}
        elif rule == "full" or i not in saved:
            allowed = {RECOMPUTE} if RECOMPUTE in node.states else {KEEP, HOLD}
        else:
            allowed = {KEEP, HOLD}
        allowed_states[i] = allowed
    # a view takes its base's state (C4): it follows the base's allowance
    follows = getattr(graph, "follows", {}) or {}
    for i in sorted(allowed_states):
        base = follows.get(i)
        if base is not None and base in allowed_states:
            allowed_states[i] = allowed_states[base]
    masks = {}
    for i, allowed in allowed_states.items():
        node = nodes[i]
        states = strategy_states(node.states, len(node.strategies))
        mask = np.isin(states, sorted(allowed))
        if not mask.all():
            masks[i] = mask
    return masks


def policy_ties(graph: object, policy: str, groups: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """``groups`` split by block class where the policy treats blocks differently (``every:K``)."""
    policy = parse_policy(policy)
    if not policy.startswith("every:"):
        return groups
    nodes = graph.nodes  # type: ignore[attr-defined]
    out = []
    for group in groups:
        parts: Mapping[object, list[int]] = {}
        for m in group:
            key = region_policy(policy, nodes[m].region) if nodes[m].region >= 0 else None
            parts.setdefault(key, []).append(m)  # type: ignore[attr-defined]
        out.extend(tuple(p) for p in parts.values() if len(p) > 1)
    return tuple(sorted(out, key=lambda g: g[0]))

"""Expert baselines as pins, priced by the same cost model as the solved plan.

Each baseline fixes the placement of every parameter (and of the batch) and
leaves every activation free, so the solver fills in the best activations for
that parameter layout; the result is what the expert baseline costs *at best*
under our cost model, which is the fair comparison for a solved plan.

- ``ddp``: parameters replicated, the batch split over every mesh dim
  (gradients all-reduced: the solver prices ``P(sum) -> R``).
- ``fsdp`` (ZeRO-3): every parameter split over every mesh dim (dim 0, or the
  first tensor dim the mesh divides), the batch split over every mesh dim.
- ``tp`` (Megatron): on the tensor-parallel mesh dim, column-parallel weights
  split on their output dim, row-parallel on their input dim (from a
  name-pattern table), the rest replicated; data parallel on the other dims.
- ``fsdp+tp``: ``tp`` on the tensor-parallel mesh dim, FSDP on the others, on
  a tensor dim ``tp`` does not split where one divides: a column weight
  ``(out, in)`` is ``S(1)S(0)`` on a ``(dp, tp)`` mesh, a row weight ``S(0)S(1)``.
  So FSDP's all-gather over ``dp`` yields the TP shard a matmul reads, one
  collective, as FSDP2 over a TP DTensor does (torchtitan stores the TP shard
  FSDP-split on its dim 0, DTensor's ``_StridedShard(0, split_factor=tp)``).
  Splitting the same dim, ``S(0)S(0)`` keeps dp-major chunks, and reaching
  the TP shard ``RS(0)`` from it takes an all-to-all on ``tp`` and a permute
  before the gather, every time the weight is gathered. The strided form
  itself is not a parameter strategy the graph offers, and the redistribution
  planner prices ``_S(0,sf=tp)S(0) -> RS(0)`` with two all-to-alls around the
  gather; the gather on dim 1 pays only a local interleaving copy
  (``relayout_s``) beside the same bytes on the wire.

On the tensor-parallel mesh dim, ``tp`` and ``fsdp+tp`` also run their ops as Megatron does
(:func:`baseline_allowed` given the layout's pins): every op that reads a weight split on that
dim (through its views: the transpose a linear reads) reads it as placed there. So a column
linear multiplies the whole input by its weight's shard and a row linear its input's shard by its
own, as torch's ``ColwiseParallel`` / ``RowwiseParallel`` run them; without this the solver could
gather the split weights on ``tp`` and run every matmul replicated (a small model on a slow link
does), which is no tensor parallelism and not what a TP runtime runs.

Sequence parallelism is not a separate baseline: its parameters are laid out
as in ``tp``, and the activations it shards along the sequence are free
here, so the ``tp`` row already takes them where they pay.

On the data-parallel mesh dims (every dim for ``ddp`` and ``fsdp``, every
dim but the tensor-parallel one for ``tp`` and ``fsdp+tp``) each layout also
runs its ops as data parallelism does (:func:`baseline_allowed`): an op input
that carries the batch stays split (not replicated), and an input made from
parameters alone is replicated, i.e. gathered before use. Without this, the
solver could all-gather the tokens and run the model replicated under FSDP's
parameter layout, which FSDP does not do. Views are exempt: they take their
input as it comes, so a parameter is gathered by the op that reads its view
(``autoshard.graph.copies``), as FSDP gathers per use.

Each layout is priced with each recomputation policy users run
(``autoshard.graph.recompute_policy``: none, full, selective, every second
block) in ``compare_baselines``; a policy restricts recomputation states
only, never placements.

The tensor-parallel mesh dim is the one named ``tp`` (else the last one).
Name-pattern tables ship for the example families (MLP, GPT-2, LLaMA, MoE)
and Hugging Face's LLaMA-family naming;
users pass theirs as ``{pattern: "col" | "row" | tensor_dim}``.

>>> TP_TABLES["llama"]["*.attention.wo.weight"]
'row'
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Iterator, Mapping

import numpy as np
from costmodel.placements import Replicate, parse_placements

from autoshard.graph.builder import StrategyGraph
from autoshard.graph.liveness import is_view_name
from autoshard.search.pins import resolve_pins

log = logging.getLogger(__name__)

__all__ = ["BASELINES", "TP_TABLES", "BaselineError", "baseline_pins", "tp_table_for", "applicable_baselines",
           "baseline_allowed", "baseline_seed_pins", "data_dims", "tensor_parallel_reads"]

BASELINES = ("ddp", "fsdp", "tp", "fsdp+tp")

TP_TABLES: dict[str, dict[str, str | int]] = {
    "llama": {
        "tok_embeddings.weight": "col", "output.weight": "col",
        "*.attention.wq.weight": "col", "*.attention.wk.weight": "col", "*.attention.wv.weight": "col",
        "*.attention.wo.weight": "row",
        "*.feed_forward.w1.weight": "col", "*.feed_forward.w3.weight": "col", "*.feed_forward.w2.weight": "row",
    },
    "gpt2": {
        "tok_embeddings.weight": "col",
        "*.attn.qkv.weight": "col", "*.attn.qkv.bias": "col", "*.attn.proj.weight": "row",
        "*.fc.weight": "col", "*.fc.bias": "col", "layers.*[0-9].proj.weight": "row",
    },
    "mlp": {"*.w1.weight": "col", "*.w1.bias": "col", "*.w2.weight": "row"},
    # Hugging Face LLaMA-family naming (LLaMA, Mistral, Qwen2, the attention of Mixtral)
    "hf-llama": {
        "*.embed_tokens.weight": "col", "lm_head.weight": "col",
        "*.self_attn.q_proj.weight": "col", "*.self_attn.k_proj.weight": "col", "*.self_attn.v_proj.weight": "col",
        "*.self_attn.q_proj.bias": "col", "*.self_attn.k_proj.bias": "col", "*.self_attn.v_proj.bias": "col",
        "*.self_attn.o_proj.weight": "row",
        "*.mlp.gate_proj.weight": "col", "*.mlp.up_proj.weight": "col", "*.mlp.down_proj.weight": "row",
    },
    "moe": {
        "tok_embeddings.weight": "col", "output.weight": "col",
        "*.attention.wq.weight": "col", "*.attention.wk.weight": "col", "*.attention.wv.weight": "col",
        "*.attention.wo.weight": "row",
        # experts stored (experts, in, out): column = split out, row = split in
        "*.moe.w1": 2, "*.moe.w3": 2, "*.moe.w2": 1,
    },
}
"""Megatron layouts by name pattern: ``col`` splits a Linear weight's output
dim (tensor dim 0), ``row`` its input dim (1); an int names the tensor dim."""


class BaselineError(ValueError):
    """A baseline that does not apply to this model or mesh."""


def tp_table_for(param_names: list[str]) -> tuple[str, dict[str, str | int]] | None:
    """The shipped table that matches most parameters (None if none matches a
    column and a row weight)."""
    best = None
    for family, table in TP_TABLES.items():
        kinds = {kind for name in param_names for pat, kind in table.items() if fnmatch.fnmatchcase(name, pat)}
        hits = sum(1 for name in param_names if any(fnmatch.fnmatchcase(name, p) for p in table))
        if len(kinds) >= 2 and (best is None or hits > best[0]):
            best = (hits, family, table)
    return None if best is None else (best[1], best[2])


def _tp_dim(graph: StrategyGraph) -> int:
    names = graph.mesh.dim_names
    return names.index("tp") if "tp" in names else graph.mesh.ndim - 1


def _split(shape: tuple[int, ...], dims: list[int | None], mesh: tuple[int, ...]) -> str | None:
    """Placement text for splitting tensor dim ``dims[k]`` on mesh dim k (None: R),
    or None when a split is uneven."""
    sizes = list(shape)
    parts = []
    for d, m in zip(dims, mesh):
        if d is None or m == 1:
            parts.append("R")
            continue
        if sizes[d] % m or sizes[d] < m:
            return None
        sizes[d] //= m
        parts.append(f"S({d})")
    return "".join(parts)


def _fsdp_dim(shape: tuple[int, ...], fixed: list[int | None], k: int, mesh: tuple[int, ...],
              avoid: int | None = None) -> int | None:
    """The tensor dim FSDP splits on mesh dim ``k`` given the other mesh dims' choices: the first
    that divides, tensor dim ``avoid`` (the one ``tp`` splits) last (module docstring, ``fsdp+tp``)."""
    order = [d for d in range(len(shape)) if d != avoid] + ([avoid] if avoid is not None else [])
    for d in order:
        trial = list(fixed)
        trial[k] = d
        if _split(shape, trial, mesh) is not None:
            return d
    return None


def applicable_baselines(graph: StrategyGraph, table: Mapping[str, str | int] | None = None) -> list[str]:
    """The baselines that apply: DDP and FSDP always, TP with a table, FSDP+TP also on >= 2-D meshes."""
    names = list(graph.params)
    has_table = table is not None or tp_table_for(names) is not None
    out = ["ddp", "fsdp"]
    if has_table:
        out.append("tp")
        if graph.mesh.ndim >= 2:
            out.append("fsdp+tp")
    return out


def baseline_pins(graph: StrategyGraph, name: str, table: Mapping[str, str | int] | None = None) -> dict[str, str]:
    """Pins (exact names -> placement) that express baseline ``name`` on ``graph``'s mesh."""
    if name not in BASELINES:
        raise BaselineError(f"baseline: unknown {name!r} (expected one of {', '.join(BASELINES)})")
    mesh = graph.mesh.shape
    n = len(mesh)
    tp = _tp_dim(graph) if name in ("tp", "fsdp+tp") else None
    if name in ("tp", "fsdp+tp"):
        if table is None:
            found = tp_table_for(list(graph.params))
            if found is None:
                raise BaselineError(f"baseline {name}: no tensor-parallel table matches this model's parameters "
                                    "(pass one: {pattern: 'col' | 'row' | tensor dim})")
            table = found[1]
        if name == "fsdp+tp" and n < 2:
            raise BaselineError("baseline fsdp+tp: needs a mesh with at least 2 dims")
    data_dims = [k for k in range(n) if k != tp]
    pins: dict[str, str] = {}
    for fqn, i in graph.params.items():
        shape = graph.nodes[i].outputs[0].shape
        dims: list[int | None] = [None] * n
        if tp is not None:
            kind = next((k for pat, k in (table or {}).items() if fnmatch.fnmatchcase(fqn, pat)), None)
            if kind is not None:
                dims[tp] = {"col": 0, "row": 1}.get(kind, kind) if isinstance(kind, str) else int(kind)
                if dims[tp] >= len(shape) or _split(shape, dims, mesh) is None:
                    dims[tp] = None  # a bias of a row weight, or an uneven split: replicated
        if name in ("fsdp", "fsdp+tp"):
            avoid = dims[tp] if tp is not None else None
            for k in data_dims:
                dims[k] = _fsdp_dim(shape, dims, k, mesh, avoid)
        text = _split(shape, dims, mesh)
        pins[fqn] = text if text is not None else "R" * n
    for input_name, i in graph.inputs.items():
        shape = graph.nodes[i].outputs[0].shape
        if not shape:
            continue
        dims = [0 if k in data_dims else None for k in range(n)]
        text = _split(shape, dims, mesh)
        if text is None:
            raise BaselineError(f"baseline {name}: input {input_name} (batch {shape[0]}) is not divisible by the "
                                f"data-parallel mesh dims {[mesh[k] for k in data_dims]}")
        pins[input_name] = text
    return pins


def baseline_seed_pins(graph: StrategyGraph) -> Iterator[dict[int, int]]:
    """The resolved pins of every expert baseline that applies to ``graph``, skipping (and
    logging) those whose pins do not resolve: extra seeds of a seeded search
    (``autoshard.graph.restrict.seeded_restriction(seed_pins=baseline_seed_pins)``).

    >>> # seeds = list(baseline_seed_pins(coarse_graph))
    """
    for name in applicable_baselines(graph):
        try:
            yield resolve_pins(graph, baseline_pins(graph, name))
        except (BaselineError, ValueError) as exc:
            log.info("seeded search: no coarse %s seed (%s)", name, exc)

def data_dims(graph: StrategyGraph, name: str) -> list[int]:
    """The data-parallel mesh dims of baseline ``name`` (module docstring)."""
    if name not in BASELINES:
        raise BaselineError(f"baseline: unknown {name!r} (expected one of {', '.join(BASELINES)})")
    tp = _tp_dim(graph) if name in ("tp", "fsdp+tp") else None
    return [k for k in range(graph.mesh.ndim) if k != tp and graph.mesh.shape[k] > 1]


def baseline_allowed(graph: StrategyGraph, name: str, pins: Mapping[str, str] | None = None) -> dict[int, np.ndarray]:
    """Op node -> the strategies that run it data parallel on the layout's data
    mesh dims (module docstring); nodes the rule would leave without a strategy
    (a loss reduction that wants a replicated scalar) and views are unrestricted.
    With the layout's ``pins`` (:func:`baseline_pins`), ``tp`` and ``fsdp+tp`` also read their
    tp-split weights as placed on the tensor-parallel dim (:func:`tensor_parallel_reads`).

    >>> # to_problem(graph, pins=..., allowed=baseline_allowed(graph, "fsdp"))
    """
    out = _data_parallel_allowed(graph, name)
    if pins is not None and name in ("tp", "fsdp+tp"):
        for i, mask in tensor_parallel_reads(graph, pins).items():
            both = out[i] & mask if i in out else mask
            if both.any():  # never a node without a strategy: left as the data-parallel rule has it
                out[i] = both
    return out


def tensor_parallel_reads(graph: StrategyGraph, pins: Mapping[str, str]) -> dict[int, np.ndarray]:
    """Op node -> the strategies that read each parameter pinned split on the tensor-parallel mesh
    dim (exact names of ``pins``, as :func:`baseline_pins` writes them) as pinned on that dim,
    following views (a view's allowed outputs are what its readers may read). Nodes with no such
    read are left out; a node whose every strategy would be refused keeps its mask all False (the
    caller drops it)."""
    from autoshard.assembly.engine_pricing import edge_links

    tp = _tp_dim(graph)
    _, readers = edge_links(graph)  # edges by producer
    out: dict[int, np.ndarray] = {}
    frontier: list[tuple[int, int, frozenset]] = []
    for fqn, text in pins.items():
        i = graph.params.get(fqn)
        if i is None:
            continue
        on_tp = parse_placements(text)[tp]
        if not isinstance(on_tp, Replicate):
            frontier.append((i, 0, frozenset({on_tp})))
    while frontier:
        src, output, placed = frontier.pop()
        for e in readers.get(src, ()):
            node = graph.nodes[e.dst]
            if e.src_output != output or node.kind != "op":
                continue
            mask = np.array([s.input_placements[e.dst_input] is None
                             or s.input_placements[e.dst_input][tp] in placed for s in node.strategies], dtype=bool)
            out[e.dst] = out[e.dst] & mask if e.dst in out else mask
            if is_view_name(node.target):
                after = frozenset(s.output_placements[0][tp] for s, ok in zip(node.strategies, mask)
                                  if ok and s.output_placements and s.output_placements[0] is not None)
                if after:
                    frontier.append((e.dst, 0, after))
    return out


def _data_parallel_allowed(graph: StrategyGraph, name: str) -> dict[int, np.ndarray]:
    """:func:`baseline_allowed` on the data mesh dims alone."""
    dims = data_dims(graph, name)
    if not dims:
        return {}
    import math

    group = math.prod(graph.mesh.shape[k] for k in dims)
    batch = np.zeros(len(graph.nodes), dtype=bool)
    for i in graph.inputs.values():
        batch[i] = True
    inputs: dict[int, list] = {}
    for e in graph.edges:  # edges are added reader by reader, in graph order
        inputs.setdefault(e.dst, []).append(e)
        if batch[e.src]:
            batch[e.dst] = True
    out: dict[int, np.ndarray] = {}
    cache: dict[tuple, np.ndarray] = {}
    for i, node in enumerate(graph.nodes):
        if node.kind != "op" or is_view_name(node.target):
            continue
        edges = sorted(inputs.get(i, []), key=lambda e: e.dst_input)
        pattern = tuple((e.dst_input, bool(batch[e.src]), e.tensor.numel >= group) for e in edges)
        key = (node.signature, pattern)
        mask = cache.get(key)
        if mask is None:
            mask = np.array([_data_parallel(s, pattern, dims) for s in node.strategies], dtype=bool)
            cache[key] = mask
        if mask.any() and not mask.all():
            out[i] = mask
    return out


def _data_parallel(strategy: object, pattern: tuple, dims: list[int]) -> bool:
    for position, carries_batch, big in pattern:
        placement = strategy.input_placements[position]  # type: ignore[attr-defined]
        if placement is None:
            continue
        replicated = all(isinstance(placement[k], Replicate) for k in dims)
        if carries_batch:
            if big and any(isinstance(placement[k], Replicate) for k in dims):
                return False
        elif not replicated:
            return False
    return True


def held_all_step_bytes(graph: StrategyGraph, pins: Mapping[int, int]) -> float:
    """Bytes the pinned nodes that live all step hold (parameters with their optimizer state,
    inputs, buffers) under problem ``pins`` (node -> strategy): a lower bound on the peak of
    every plan with those pins, whatever it recomputes, so a layout whose bound is over the
    memory limit fits under no policy and needs no solve to say so."""
    return float(sum(graph.nodes[i].memory_bytes[k] for i, k in pins.items() if graph.nodes[i].live is None))

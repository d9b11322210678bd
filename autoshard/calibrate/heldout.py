"""The held-out set of the accuracy check: ops and collectives that the fit
never saw, each with the time the cost model predicts and the time measured.

Why held out: a profile fitted on adds and square GEMMs can reproduce exactly
those and still misprice a layer norm or a skinny GEMM; only items outside
the fit say how well the solver's prices track reality.

* synthetic ops: GEMMs of other shapes (skinny, transposed operands, addmm,
  bmm), elementwise ops other than add (mul, broadcast sub, silu, rsqrt, ...),
  reductions, softmax, layer norm, attention shapes, copies, at sizes between
  the fitted ones;
* the ops of a traced example model (by default a LLaMA-3-style decoder,
  forward and backward): each distinct (op, shapes) of its joint graph, run
  alone on random inputs with the graph's shapes and strides;
* collectives of every kind on every measured group at sizes between the
  fitted ones (``measure_collectives.heldout_sizes``).

Predictions use the solver's own code path: for model ops the compute cost of
the replicated strategy from ``autoshard.graph.build_graph`` on a 1-rank mesh;
for synthetic ops the rule's ``OpCompute`` priced by
``costmodel.compute.op_time_s`` exactly as the graph builder does; for
collectives ``costmodel.collectives.collective_time_s`` on the mesh.

>>> len(synthetic_ops("tiny")) > 5
True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.fx.node import map_arg

from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

from autoshard.calibrate.measure_collectives import Groups, collective_items
from autoshard.calibrate.measure_compute import Item
from autoshard.calibrate.timing import Job, Settings, measure

__all__ = ["CheckItem", "OpSpec", "synthetic_ops", "model_ops", "compute_check_items", "collective_check_items",
           "reference_check_items", "DEFAULT_MODEL"]

aten = torch.ops.aten

DEFAULT_MODEL = ("examples.models.llama3:tiny",
                 {"dim": 256, "n_heads": 8, "n_kv_heads": 4, "multiple_of": 64, "max_seq_len": 256,
                  "batch_size": 4, "seq_len": 128, "vocab_size": 2048})
"""The model whose ops the check times: a 2-layer LLaMA-3 block stack at
width 256, 512 tokens (the test-sized ``tiny`` is launch-bound throughout)."""


@dataclass(frozen=True, slots=True)
class CheckItem:
    """One held-out item: predicted against measured."""

    category: str
    """``compute`` or ``collectives`` (held out), or ``reference`` (a fit-set
    item measured again, for the machine's drift)."""
    kind: str
    """Compute kind (``matmul``, ``elementwise``, ``reduction``, ``attention``,
    ``copy``) or collective kind."""
    label: str
    source: str
    """``synthetic``, ``model`` or the group's mesh dims."""
    predicted_s: float
    measured_s: float
    count: int = 1
    """Occurrences in the model's graph."""

    @property
    def seconds(self) -> float:
        """The measured time (as on measurement samples)."""
        return self.measured_s

    def with_seconds(self, seconds: float) -> "CheckItem":
        return dataclasses.replace(self, measured_s=seconds)

    @property
    def error(self) -> float:
        """Relative error ``(predicted - measured) / measured``."""
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One ATen call to time: how to build its arguments on a device."""

    label: str
    op: Any
    make: Callable[[torch.device], tuple[tuple, dict]]
    source: str = "synthetic"
    count: int = 1
    predicted_s: float | None = None
    """Set when the prediction comes from elsewhere (the graph builder)."""


def _randn(*shape: int) -> Callable[[torch.device], torch.Tensor]:
    return lambda device: torch.randn(*shape, device=device)


def _op(label: str, op: Any, *makers: Any, **kwargs: Any) -> OpSpec:
    def make(device: torch.device) -> tuple[tuple, dict]:
        return tuple(m(device) if callable(m) else m for m in makers), dict(kwargs)

    return OpSpec(label, op, make)


def _sdpa_call(device_type: str, *shape: int) -> tuple[Any, ...]:
    """The causal attention op a plan runs on ``device_type`` for fp32 ``shape`` inputs
    (``autoshard.trace.device``: CUDA's memory-efficient kernel, CPU's flash kernel), and its arguments."""
    q, k, v = _randn(*shape), _randn(*shape), _randn(*shape)
    if device_type == "cuda":
        return aten._scaled_dot_product_efficient_attention.default, q, k, v, None, True, 0.0, True
    return aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, 0.0, True


def synthetic_ops(mode: str, device_type: str = "cpu") -> list[OpSpec]:
    """Synthetic held-out ops (module docstring); ``tiny`` keeps a few small ones;
    attention is the kernel of ``device_type``."""
    sizes = [3000, 50000, 700000] if mode == "tiny" else [3000, 50000, 700000, 6000000]
    ops = [
        _op("mm 384x1000x96", aten.mm.default, _randn(384, 1000), _randn(1000, 96)),
        _op("mm 1000x96x640", aten.mm.default, _randn(1000, 96), _randn(96, 640)),
        _op("mm t(300x700)@300x200", aten.mm.default, lambda d: torch.randn(300, 700, device=d).t(), _randn(300, 200)),
        _op("addmm 600x600x600", aten.addmm.default, _randn(600), _randn(600, 600), _randn(600, 600)),
        _op("bmm 8x128x64x128", aten.bmm.default, _randn(8, 128, 64), _randn(8, 64, 128)),
        _op("softmax 512x1000", aten._softmax.default, _randn(512, 1000), -1, False),
        _op("layer_norm 2048x384", aten.native_layer_norm.default, _randn(2048, 384), [384], _randn(384),
            _randn(384), 1e-5),
        _op("sum 4096x300 dim 1", aten.sum.dim_IntList, _randn(4096, 300), [1]),
        _op("mean 700x1000 dim 0", aten.mean.dim, _randn(700, 1000), [0]),
        _op("cat 2x 1000x500", aten.cat.default, lambda d: [torch.randn(1000, 500, device=d)] * 2),
        _op("clone t(900x700)", aten.clone.default, lambda d: torch.randn(900, 700, device=d).t(),
            memory_format=torch.contiguous_format),
        _op("sdpa fwd 4x4x192x48", *_sdpa_call(device_type, 4, 4, 192, 48)),
    ]
    if mode != "tiny":
        ops += [
            _op("mm 2500x320x2500", aten.mm.default, _randn(2500, 320), _randn(320, 2500)),
            _op("mm 64x4000x64", aten.mm.default, _randn(64, 4000), _randn(4000, 64)),
            _op("softmax 64x8x200x200", aten._softmax.default, _randn(64, 8, 200, 200), -1, False),
            _op("layer_norm 256x96", aten.native_layer_norm.default, _randn(256, 96), [96], _randn(96), _randn(96), 1e-5),
            _op("sdpa fwd 2x8x384x96", *_sdpa_call(device_type, 2, 8, 384, 96)),
        ]
    for n in sizes:
        rows = max(1, n // 500)
        ops += [
            _op(f"mul {n}", aten.mul.Tensor, _randn(n), _randn(n)),
            _op(f"mul scalar {n}", aten.mul.Tensor, _randn(n), 0.5),
            _op(f"sub bias {rows}x500", aten.sub.Tensor, _randn(rows, 500), _randn(500)),
            _op(f"silu {n}", aten.silu.default, _randn(n)),
            _op(f"rsqrt {n}", aten.rsqrt.default, lambda d, n=n: torch.rand(n, device=d) + 0.5),
            _op(f"neg {n}", aten.neg.default, _randn(n)),
        ]
    return ops


def _real(val: Any, device: torch.device) -> Any:
    """A real tensor like a traced FakeTensor (shape, strides, dtype); integer
    tensors are zeros (valid indices), booleans true."""
    if not isinstance(val, torch.Tensor):
        return val
    shape, stride = tuple(val.shape), tuple(val.stride())
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 0) if all(shape) else 0
    storage = torch.empty(span, dtype=val.dtype, device=device)
    if val.dtype.is_floating_point:
        storage.normal_()
    else:
        storage.fill_(1 if val.dtype == torch.bool else 0)
    return storage.as_strided(shape, stride)  # expanded (stride 0) and transposed inputs as in the graph


def model_ops(spec: str, overrides: dict, profile: HardwareProfile, device_type: str = "cpu") -> list[OpSpec]:
    """One :class:`OpSpec` per distinct (op, shapes) of the joint graph of
    the example ``spec`` (``MODULE:FACTORY``) traced for ``device_type`` (its
    attention kernels are that device's), views excluded (the cost model
    counts them free), each predicted by the graph builder on a 1-rank mesh."""
    from autoshard.trace.model_spec import load_model
    from autoshard.graph.builder import build_graph
    from autoshard.rules import load_rules, op_name
    from autoshard.trace import trace_joint

    model, inputs = load_model(spec, {**overrides, "device": "meta"})
    traced = trace_joint(model, inputs, target_device=device_type)
    graph = build_graph(traced, MeshSpec((1,)), profile)
    rules = load_rules()
    seen: dict[str, OpSpec] = {}
    for node in traced.graph_module.graph.nodes:
        info = traced.nodes.get(node.name)
        if node.op != "call_function" or info is None or node.name not in graph.index:
            continue
        work = rules.compute_kind(info.op, info.args, info.kwargs, out_meta=info.outputs)
        if work.kind == "view":
            continue
        shapes = ",".join("x".join(map(str, m.shape)) for m in info.inputs)
        vals = [a.meta.get("val") for a in node.all_input_nodes]
        strided = any(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in vals)
        label = f"{op_name(info.op).removeprefix('aten.')} {shapes}" + (" (strided)" if strided else "")
        key = label + repr([tuple(v.stride()) for v in vals if isinstance(v, torch.Tensor)])
        if key in seen:
            old = seen[key]
            seen[key] = OpSpec(label, info.op, old.make, "model", old.count + 1, old.predicted_s)
            continue
        args, kwargs = node.args, node.kwargs

        def make(device: torch.device, args: Any = args, kwargs: Any = kwargs) -> tuple[tuple, dict]:
            def value(n: Any) -> Any:
                return _real(n.meta["val"], device)

            return map_arg(args, value), map_arg(kwargs, value)

        predicted = float(graph.nodes[graph.index[node.name]].compute_s[0])
        seen[key] = OpSpec(label, info.op, make, "model", 1, predicted)
    return list(seen.values())


def _predict(spec: OpSpec, args: tuple, kwargs: dict, out: Any, profile: HardwareProfile,
             rules: Any) -> tuple[str, float]:
    """(kind, seconds) as ``autoshard.graph.builder`` prices a replicated op:
    the rule's ``OpCompute``, with the run and scalar operand read off the
    real tensors (``autoshard.graph.access``)."""
    from autoshard.graph.access import has_scalar_operand, inner_run, reduced_dims
    from autoshard.rules.core import to_meta

    work = rules.compute_kind(spec.op, to_meta(args), to_meta(kwargs))
    if spec.predicted_s is not None:
        return work.kind, spec.predicted_s
    tensors = [a for a in [*args, *(x for a in args if isinstance(a, list) for x in a)] if isinstance(a, torch.Tensor)]
    dtype = next((str(t.dtype) for t in tensors if t.dtype.is_floating_point), "torch.float32")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    reduced = reduced_dims(rules.op_call(spec.op, to_meta(args), to_meta(kwargs))) if work.kind == "reduction" else None
    run = inner_run(work.kind, tensors, outs, reduced=reduced)
    allocated = [float(o.numel() * o.element_size()) for o in outs if isinstance(o, torch.Tensor)]
    return work.kind, op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed, dtype=dtype,
                                profile=profile, run_elems=run, scalar_operand=has_scalar_operand(spec.op, args, kwargs),
                                output_bytes=allocated, op=str(spec.op))


def compute_check_items(specs: list[OpSpec], profile: HardwareProfile) -> list[Item]:
    """Measurement items for held-out ops; each returns one :class:`CheckItem`
    (none when the op cannot run on this device: e.g. the CPU flash attention
    op on a GPU)."""
    from autoshard.rules import load_rules

    rules = load_rules()

    def item(spec: OpSpec) -> Item:
        def run(job: Job, settings: Settings) -> list[CheckItem]:
            try:
                args, kwargs = spec.make(job.device)
                out = spec.op(*args, **kwargs)
                kind, predicted = _predict(spec, args, kwargs, out, profile, rules)
                ok = True
            except (RuntimeError, NotImplementedError, ValueError):
                ok = False
            if not job.all_agree(ok):
                return []
            t = measure(job, lambda: spec.op(*args, **kwargs), settings)
            return [CheckItem("compute", kind, spec.label, spec.source, predicted, t.seconds, spec.count)]

        return Item(f"check {spec.label}", 0.1, run)

    return [item(s) for s in specs]


def collective_check_items(groups: Groups, mode: str, profile: HardwareProfile) -> list[Item]:
    """Held-out collective measurements on every group, predicted by
    ``collective_time_s`` on the job's mesh."""
    items = []
    for base in collective_items(groups, mode, heldout=True):
        def run(job: Job, settings: Settings, base: Item = base) -> list[CheckItem]:
            out = []
            for s in base.run(job, settings):
                predicted = collective_time_s(s.kind, s.nbytes, s.mesh_dims, groups.spec, profile)
                dims = ",".join(groups.spec.dim_names[d] for d in s.mesh_dims)
                out.append(CheckItem("collectives", s.kind, f"{s.kind} {_size(s.nbytes)} on {dims} ({s.ranks} ranks)",
                                     f"dims {dims}", predicted, s.seconds))
            return out

        items.append(Item(base.label, base.weight, run, base.repeat))
    return items


def reference_check_items(job: Job, profile: HardwareProfile, groups: Groups | None) -> list[Item]:
    """Fit-set items measured again (category ``reference``): the drift of
    the machine since the calibration, reported apart from the held-out
    errors (``measure_compute.reference_items``; all_gather of 4 KiB and
    all_reduce of 2 MiB on every group)."""
    from autoshard.calibrate.fit import predict_compute
    from autoshard.calibrate.measure_collectives import _item as collective_item
    from autoshard.calibrate.measure_compute import reference_items

    def wrap(base: Item, groups: Groups | None = None) -> Item:
        def run(job: Job, settings: Settings) -> list[CheckItem]:
            out = []
            for s in base.run(job, settings):
                if groups is None:
                    predicted, kind, label = predict_compute(s, profile), s.kind, f"{s.op} {s.shape} {s.dtype}"
                else:
                    predicted = collective_time_s(s.kind, s.nbytes, s.mesh_dims, groups.spec, profile)
                    dims = ",".join(groups.spec.dim_names[d] for d in s.mesh_dims)
                    kind, label = s.kind, f"{s.kind} {_size(s.nbytes)} on {dims} ({s.ranks} ranks)"
                out.append(CheckItem("reference", kind, label, "fit set", predicted, s.seconds))
            return out

        return Item(f"reference {base.label}", base.weight, run, base.repeat)

    items = [wrap(i) for i in reference_items(job)]
    if groups is not None:
        for dims in groups.groups:
            items += [wrap(collective_item(groups, "all_gather", dims, 4096), groups),
                      wrap(collective_item(groups, "all_reduce", dims, 2**21), groups)]
    return items


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if math.isclose(value, round(value)) else f"{value:.1f} {unit}"
    return f"{nbytes} B"

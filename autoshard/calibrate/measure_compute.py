"""What the device computes, as the cost model needs it: the points that
``autoshard.calibrate.fit`` turns into a profile's device figures.

Why these six families: ``costmodel.compute`` prices an op as
``max(F / (P * e(F)), B / (W * e_mem(B))) / e_run(r) + launch``, so a profile needs

* ``launch``: the floor of any op: the median of 1-element calls of add,
  neg and sum (``launch_s``), and of ops with a Python-scalar operand: mul
  by a Python float, ``mul.Scalar``, ``add.Scalar`` (``launch_scalar_s``: the
  scalar is wrapped into a tensor on every call, about twice the floor);
* ``matmul``: GEMMs over sizes (square and the skinny shapes of activations
  times weights and of weight gradients) in the primary dtype (fp32 on CPU,
  bf16 on GPU) for the efficiency curve ``e(F)``, and squares in the other
  dtypes for their own peaks and curves (bf16 GEMMs on a CPU with AMX, or
  fp8 on a GPU, saturate at other sizes than the primary dtype);
* ``memory``: out-of-place adds and copies (what a training step's
  elementwise ops and re-layouts do, allocation included) over working sets
  from a few KiB to hundreds of MiB, for the bandwidth curve ``e_mem(B)``:
  working sets that fit a cache (CPU L1/L2, a GPU's L2) stream several times
  faster than DRAM/HBM; and, from 16 MiB up, copies into a buffer allocated
  once (``copy_``) beside the clones of the same size: the difference is the
  cost of fresh pages (``device.fresh_pages``: glibc maps allocations of
  32 MiB and more afresh on every call), which the curve must not absorb;
* ``vector``: compute-heavy ops (silu, gelu, softmax, log-softmax, layer
  norm, forward and backward; rsqrt, exp, tanh, sigmoid) for the vector
  efficiency: the rate at which elementwise FLOPs (as the rules count them)
  run, far below a CPU's GEMM peak, per op (``efficiency.vector_by_op``) and
  over all of them (``efficiency.vector``, for the ops not measured);
* ``attention``: the backend's fused scaled-dot-product attention, forward
  and backward, causal as in decoder LLMs, for the attention curves (the
  backward has its own: ``attention_backward``); on a GPU also one long
  sequence (:data:`LONG_ATTENTION`: 8,192 and 32,768 tokens, 32 heads of
  128, as an 8B model trains at long context), since a curve is held flat
  beyond its last point and flash attention at long sequences runs far
  nearer its peak than the short shapes say (the CPU skips them: seconds a
  call there, and no CPU plan runs such sequences);
* ``access``: the layouts of a decoder's joint graph whose innermost
  contiguous run is ``r`` elements (:data:`ACCESS_PATTERNS`: transposed and
  strided copies, cat of a strided half, broadcasts inside the row, clones of
  expanded tensors and their middle-dim sums, an op on an expanded input),
  each with a contiguous twin, for the run curve ``e_run(r)``
  (``autoshard.graph.access`` finds ``r`` for a traced op).

Every sample records the FLOPs and bytes that ``autoshard.rules.compute``
counts for the same op, so the fit and the cost model agree on units. Ops
are called as ATen op overloads (``torch.ops.aten.add.Tensor``), as the
runtime's per-rank graph calls them: that path costs ~0.6 us more per call
on CPU than ``torch.add``.

>>> from autoshard.calibrate.timing import Job
>>> items = compute_items(Job.single(), "tiny")
>>> sorted({i.label.split()[0] for i in items})
['access', 'attention', 'launch', 'matmul', 'memory', 'vector']
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from autoshard.calibrate.timing import Job, Settings, measure

__all__ = ["MODES", "ComputeSample", "Item", "compute_items", "reference_items", "primary_dtype", "available_bytes",
           "LAUNCH_SCALAR_OPS", "vector_op_name", "LONG_ATTENTION"]

MODES = ("full", "quick", "tiny")

aten = torch.ops.aten

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}

LONG_ATTENTION = {"full": (8192, 16384, 32768, 65536), "quick": (8192, 32768)}
"""Sequence lengths of the long attention samples per mode, on a GPU only: one causal sequence
of :data:`LONG_HEADS` heads of :data:`LONG_HEAD_DIM` in the primary dtype (bf16), forward and
backward. At 32,768 tokens a call is ~9 TFLOP forward and ~22 TFLOP backward: tens of ms on
an H100, so ``--quick`` spends well under a second on each."""
LONG_HEADS, LONG_HEAD_DIM = 32, 128


@dataclass(frozen=True, slots=True)
class ComputeSample:
    """One measured op."""

    kind: str
    """``launch``, ``matmul``, ``memory``, ``vector``, ``attention``, ``access``
    or ``access_twin`` (the contiguous twin of an access sample)."""
    op: str
    """What ran (``mm``, ``add``, ``clone``, ``sdpa_fwd``, ``sdpa_bwd``,
    ``mul_scalar``; for access: ``copy``, ``add``, ``sum``)."""
    shape: str
    """Its sizes, e.g. ``512x512x512`` (m x k x n) or ``1048576``."""
    dtype: str
    """Short dtype key (``fp32``, ``bf16``, ...)."""
    flops: float
    bytes_accessed: float
    seconds: float
    spread: float
    """(max - min) / median of the kept trials."""
    run: float = math.inf
    """Innermost contiguous run in elements (access samples; inf: contiguous)."""
    out_bytes: float = 0.0
    """Bytes of the output each call allocates (0: none, or not recorded)."""

    def with_seconds(self, seconds: float) -> "ComputeSample":
        return dataclasses.replace(self, seconds=seconds)

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "op": self.op, "shape": self.shape, "dtype": self.dtype, "flops": self.flops,
               "bytes_accessed": self.bytes_accessed, "seconds": self.seconds, "spread": self.spread}
        if math.isfinite(self.run):
            out["run"] = self.run
        if self.out_bytes:
            out["out_bytes"] = self.out_bytes
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ComputeSample":
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Item:
    """One unit of measurement work, for the progress bar."""

    label: str
    weight: float
    """Rough seconds it takes, so that the progress bar's ETA means something."""
    run: Callable[[Job, Settings], list]
    repeat: bool = True
    """Measured in every pass (short items, where a burst of outside load
    matters); long items, which average over seconds anyway, once."""


def primary_dtype(job: Job) -> str:
    """The dtype of the efficiency curves: bf16 on GPUs (what models train in),
    fp32 on CPU (where bf16 GEMMs are a special path).

    >>> primary_dtype(Job.single())
    'fp32'
    """
    return "bf16" if job.is_cuda else "fp32"


def available_bytes(job: Job) -> int:
    """Memory one rank may use for buffers: a quarter of what is free on its
    device, shared by the ranks of the host on CPU.

    >>> available_bytes(Job.single()) > 2**20
    True
    """
    if job.is_cuda:
        free, _ = torch.cuda.mem_get_info(job.device)
        return int(free) // 4
    try:
        with open("/proc/meminfo") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return free // (4 * max(job.local_world, 1))


def _sizes(mode: str, job: Job) -> dict:
    """Sizes measured per family. Attention shapes are ``(batch x heads, seq,
    head_dim)`` as in decoder training (8-32 heads of 32-128 per batch row)."""
    scale = 4 if job.is_cuda else 1
    if mode == "full":
        sizes = dict(square=[16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048],
                     rect=[32, 64, 128, 256, 512], dtype=[32, 64, 128, 256, 512, 1024],
                     memory=[2**k for k in range(8, 27)], vector=[2**12, 2**15, 2**18, 2**21, 2**24],
                     attention=[(bh, s, d) for s in (64, 256, 1024) for d in (32, 64, 128) for bh in (16,)]
                     + [(32, 128, 64), (32, 512, 64)],
                     access=[2**17, 2**20])
    elif mode == "quick":
        sizes = dict(square=[16, 32, 64, 128, 256, 512, 1024], rect=[64, 256], dtype=[64, 256, 512],
                     memory=[2**k for k in range(8, 25)], vector=[2**14, 2**18, 2**22],
                     attention=[(16, 128, 32), (16, 512, 64), (32, 256, 128)],
                     access=[2**18])
    elif mode == "tiny":
        sizes = dict(square=[16, 64, 128], rect=[], dtype=[64], memory=[2**8, 2**12, 2**16], vector=[2**12],
                     attention=[(4, 64, 32)], access=[2**12])
    else:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if scale > 1:
        sizes["square"] = [s * scale for s in sizes["square"]]
        sizes["rect"] = [s * scale for s in sizes["rect"]]
        sizes["dtype"] = [s * scale for s in sizes["dtype"]]
        sizes["memory"] = sizes["memory"] + [sizes["memory"][-1] * 4, sizes["memory"][-1] * 16]
        sizes["attention"] = [(bh, s * scale, d) for bh, s, d in sizes["attention"]]
    sizes["attention_long"] = _long_attention(mode, job)
    fresh = {"full": [2**22, 2**23 - 2**10, 2**23, 2**24, 2**25], "quick": [2**23 - 2**10, 2**23, 2**24]}
    sizes["fresh"] = [] if job.is_cuda else fresh.get(mode, [])  # GPU caching allocators keep their pages
    budget = available_bytes(job)
    sizes["fresh"] = [n for n in sizes["fresh"] if 2 * 4 * n <= budget]
    sizes["memory"] = [n for n in sizes["memory"] if 3 * 4 * n <= budget]
    sizes["vector"] = [n for n in sizes["vector"] if 2 * 4 * n <= budget]
    sizes["access"] = [n for n in sizes["access"] if 4 * 4 * n <= budget]
    return sizes


def _long_attention(mode: str, job: Job) -> list[tuple[int, int, int]]:
    """``(heads, seq, head_dim)`` of the long single-sequence attention samples of ``mode``:
    on a GPU only, and only those whose backward's tensors (q, k, v, out, its gradient and
    three input gradients, ~8 of them) fit a quarter of the free device memory."""
    if not job.is_cuda:
        return []
    itemsize = _DTYPES[primary_dtype(job)].itemsize
    budget = available_bytes(job)
    return [(LONG_HEADS, s, LONG_HEAD_DIM) for s in LONG_ATTENTION.get(mode, ())
            if 8 * LONG_HEADS * s * LONG_HEAD_DIM * itemsize <= budget]


_LAUNCH_OPS = {
    "add": lambda x: aten.add.Tensor(x, x),
    "mul_scalar": lambda x: aten.mul.Tensor(x, 0.5),  # a Python scalar costs a wrapped tensor per call
    "neg": lambda x: aten.neg.default(x),
    "sum": lambda x: aten.sum.default(x),
    "mul_Scalar": lambda x: aten.mul.Scalar(x, 0.5),
    "add_Scalar": lambda x: aten.add.Scalar(x, 1.0),
}
"""1-element calls of common ops; the launch floor is the median of the
tensor-only ones, ``launch_scalar_s`` that of :data:`LAUNCH_SCALAR_OPS`."""

LAUNCH_SCALAR_OPS = ("mul_scalar", "mul_Scalar", "add_Scalar")
"""Launch items with a Python-scalar operand (``autoshard.graph.access.has_scalar_operand``)."""


def _launch_item(op: str) -> Item:
    def run(job: Job, settings: Settings) -> list[ComputeSample]:
        x = torch.ones(1, device=job.device)
        t = measure(job, lambda: _LAUNCH_OPS[op](x), settings)
        return [ComputeSample("launch", op, "1", "fp32", 1.0, 8.0, t.seconds, t.spread)]

    return Item(f"launch {op} 1", 0.1, run)


def _matmul_item(m: int, k: int, n: int, dtype: str) -> Item:
    torch_dtype = _DTYPES[dtype]
    flops = 2.0 * m * k * n

    def run(job: Job, settings: Settings) -> list[ComputeSample]:
        a = torch.randn(m, k, device=job.device, dtype=torch_dtype)
        b = torch.randn(k, n, device=job.device, dtype=torch_dtype)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            t = measure(job, lambda: aten.mm.default(a, b), settings)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        nbytes = float(a.element_size() * (m * k + k * n + m * n))
        return [ComputeSample("matmul", "mm", f"{m}x{k}x{n}", dtype, flops, nbytes, t.seconds, t.spread,
                              out_bytes=float(a.element_size() * m * n))]

    return Item(f"matmul {dtype} {m}x{k}x{n}", 0.1 + flops / 2e10, run)


def _memory_item(op: str, numel: int) -> Item:
    """``add`` (out of place, 3 tensors), ``clone`` (2) or ``copy_`` (into a
    buffer allocated once: no allocation in the timed call)."""
    tensors = 3 if op == "add" else 2

    def run(job: Job, settings: Settings) -> list[ComputeSample]:
        a = torch.randn(numel, device=job.device)
        b = torch.randn(numel, device=job.device)
        fn = {"add": lambda: aten.add.Tensor(a, b), "clone": lambda: aten.clone.default(a),
              "copy_": lambda: b.copy_(a)}[op]
        t = measure(job, fn, settings)
        return [ComputeSample("memory", op, str(numel), "fp32", float(numel) if op == "add" else 0.0,
                              float(tensors * 4 * numel), t.seconds, t.spread,
                              out_bytes=0.0 if op == "copy_" else 4.0 * numel)]

    return Item(f"memory {op} {numel}", 0.1 + tensors * 4 * numel / 2e9, run)


def _layer_norm_backward_args(a: torch.Tensor, w: torch.Tensor) -> tuple:
    mean = a.mean(-1, keepdim=True)
    rstd = torch.rsqrt(a.var(-1, keepdim=True, unbiased=False) + 1e-5)
    return (torch.randn_like(a), a, [a.shape[-1]], mean, rstd, w, w, [True, True, True])


_VECTOR_OPS = {
    "silu": (aten.silu.default, lambda a, w: (a,)),
    "silu_backward": (aten.silu_backward.default, lambda a, w: (torch.randn_like(a), a)),
    "gelu": (aten.gelu.default, lambda a, w: (a,)),
    "gelu_backward": (aten.gelu_backward.default, lambda a, w: (torch.randn_like(a), a)),
    "softmax": (aten._softmax.default, lambda a, w: (a, -1, False)),
    "softmax_backward": (aten._softmax_backward_data.default,
                         lambda a, w: (torch.randn_like(a), torch.softmax(a, -1), -1, a.dtype)),
    "log_softmax": (aten._log_softmax.default, lambda a, w: (a, -1, False)),
    "log_softmax_backward": (aten._log_softmax_backward_data.default,
                             lambda a, w: (torch.randn_like(a), torch.log_softmax(a, -1), -1, a.dtype)),
    "layer_norm": (aten.native_layer_norm.default, lambda a, w: (a, [a.shape[-1]], w, w, 1e-5)),
    "layer_norm_backward": (aten.native_layer_norm_backward.default, _layer_norm_backward_args),
    "rsqrt": (aten.rsqrt.default, lambda a, w: (a.abs() + 1.0,)),
    "exp": (aten.exp.default, lambda a, w: (a,)),
    "tanh": (aten.tanh.default, lambda a, w: (a,)),
    "sigmoid": (aten.sigmoid.default, lambda a, w: (a,)),
}
"""The compute-heavy ops of training graphs (activations and their
gradients, softmax, normalisation, the transcendentals that norms and
attention call), each for its own vector fraction (``efficiency.vector_by_op``)
and all of them for ``vector``: per FLOP as the rules count them they run
several times apart (CPU: gelu ~0.03 ns, rsqrt ~0.17 ns). Rows of 256, FLOPs
and bytes as the rules count them."""


def vector_op_name(op: str) -> str | None:
    """The aten op of a ``vector`` sample's ``op`` (``silu`` -> ``aten.silu.default``), None if unknown.

    >>> vector_op_name("softmax_backward"), vector_op_name("nope")
    ('aten._softmax_backward_data.default', None)
    """
    return str(_VECTOR_OPS[op][0]) if op in _VECTOR_OPS else None


def _vector_item(op: str, numel: int) -> Item:
    def run(job: Job, settings: Settings) -> list[ComputeSample]:
        from autoshard.rules import load_rules
        from autoshard.rules.core import to_meta

        fn, make_args = _VECTOR_OPS[op]
        a = torch.randn(max(1, numel // 256), 256, device=job.device)
        args = make_args(a, torch.randn(256, device=job.device))
        work = load_rules().compute_kind(fn, to_meta(args), {})
        t = measure(job, lambda: fn(*args), settings)
        return [ComputeSample("vector", op, f"{a.shape[0]}x256", "fp32", work.flops, work.bytes_accessed, t.seconds,
                              t.spread, out_bytes=float(a.numel() * a.element_size()))]

    return Item(f"vector {op} {numel}", 0.1 + numel / 5e8, run)


def _attention_item(batch_heads: int, seq: int, head_dim: int, dtype: str, backward: bool,
                    heads: int | None = None) -> Item:
    """Causal SDPA on ``batch_heads`` (batch x heads) rows of ``seq`` x ``head_dim``: 8 heads a
    batch row, or ``heads`` a row when given (one long sequence: ``heads == batch_heads``)."""
    one_sequence = heads is not None
    if heads is None:
        batch, heads = max(1, batch_heads // 8), min(batch_heads, 8)
    else:
        batch = max(1, batch_heads // heads)
    torch_dtype = _DTYPES[dtype]
    pairs = seq * (seq + 1) / 2  # causal: autoshard.rules.compute.attention_compute counts the pairs it computes
    fwd_flops = 4.0 * batch * heads * pairs * head_dim
    flops = fwd_flops * (2.5 if backward else 1.0)
    shape = f"{batch}x{heads}x{seq}x{head_dim}"

    def run(job: Job, settings: Settings) -> list[ComputeSample]:
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device=job.device, dtype=torch_dtype,
                               requires_grad=backward) for _ in range(3))
        itemsize = q.element_size()
        act = batch * heads * seq * head_dim * itemsize
        lse = batch * heads * seq * 4
        if backward:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(out)

            def fn() -> object:
                return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

            nbytes = 8.0 * act + lse  # grad_out, q, k, v, out, lse in; 3 grads out
        else:
            def fn() -> object:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            nbytes = 4.0 * act + lse
        t = measure(job, fn, settings)
        op = "sdpa_bwd" if backward else "sdpa_fwd"
        return [ComputeSample("attention", op, shape, dtype, flops, nbytes, t.seconds, t.spread)]

    label = f"attention {'bwd' if backward else 'fwd'} {shape}"
    if one_sequence:  # a GPU's long sequence: tens of ms a call, averaged over the call
        return Item(label, 0.5 + flops / 2e14, run, repeat=False)
    return Item(label, 0.1 + flops / 1e10, run)


ACCESS_PATTERNS = {
    # name: (kind as the rules price it, runs measured), the layouts of a decoder's joint graph
    "copy_t": ("copy", (1,)),                        # a transposed copy (.t().contiguous())
    "div_expanded": ("elementwise", (1,)),           # div.Scalar of an expanded row (mean's backward)
    "copy_slice": ("copy", (16, 64, 256, 4096)),     # clone of a strided half (rotary embedding)
    "cat_slice": ("copy", (16, 64)),                 # cat of a strided half with a contiguous one
    "mul_bcast": ("elementwise", (16, 32, 64, 256, 4096)),  # [B, T, H, r] * [1, T, 1, r] (rotary frequencies)
    "clone_expand": ("copy", (32, 64)),              # clone of [B, T, H, 1, r] expanded to 2 (repeat_kv)
    "sum_middle": ("reduction", (32, 64)),           # its backward: sum over the repeated dim
}
"""The access patterns: each an op whose innermost contiguous run is ``r``
elements in the layout it has in a traced decoder (``autoshard.graph.access``
finds the same ``r``), with its kind as the rules price it. Runs of 4096
anchor the curve where runs are long enough to stream."""


def _access_tensors(pattern: str, numel: int, run: int, device: torch.device):
    """(op, its contiguous twin, FLOPs, bytes, twin bytes) of ``pattern``;
    bytes as the rules count them (shapes, not strides)."""
    t = max(1, numel // (16 * run))  # [4, t, 4, run]: numel elements
    shape = (4, t, 4, run)
    n = math.prod(shape)
    if pattern == "copy_t":
        side = max(2, int(math.isqrt(numel)))
        src, twin = torch.randn(side, side, device=device).t(), torch.randn(side, side, device=device)
        return (lambda: aten.clone.default(src, memory_format=torch.contiguous_format),
                lambda: aten.clone.default(twin), 0.0, 8.0 * side * side, 8.0 * side * side)
    if pattern == "div_expanded":
        rows = max(1, numel // 256)
        src, twin = torch.randn(rows, 1, device=device).expand(rows, 256), torch.randn(rows, 256, device=device)
        return (lambda: aten.div.Scalar(src, 3.0), lambda: aten.div.Scalar(twin, 3.0), float(rows * 256),
                8.0 * rows * 256, 8.0 * rows * 256)
    if pattern in ("copy_slice", "cat_slice"):
        half = torch.randn(*shape[:-1], 2 * run, device=device)[..., :run]
        other, twin = torch.randn(shape, device=device), torch.randn(shape, device=device)
        if pattern == "copy_slice":
            return (lambda: aten.clone.default(half, memory_format=torch.contiguous_format),
                    lambda: aten.clone.default(twin), 0.0, 8.0 * n, 8.0 * n)
        return (lambda: aten.cat.default([other, half], -1), lambda: aten.cat.default([other, twin], -1), 0.0,
                16.0 * n, 16.0 * n)
    if pattern == "mul_bcast":
        a, b, b2 = (torch.randn(shape, device=device), torch.randn(1, t, 1, run, device=device),
                    torch.randn(shape, device=device))
        return (lambda: aten.mul.Tensor(a, b), lambda: aten.mul.Tensor(a, b2), float(n),
                4.0 * (2 * n + t * run), 12.0 * n)
    five = (4, t, 4, 2, run)
    if pattern == "clone_expand":
        src = torch.randn(4, t, 4, 1, run, device=device).expand(five)
        twin = torch.randn(five, device=device)
        return (lambda: aten.clone.default(src, memory_format=torch.contiguous_format),
                lambda: aten.clone.default(twin), 0.0, 16.0 * n, 16.0 * n)
    x, flat = torch.randn(five, device=device), torch.randn(2, 2 * n, device=device)  # sum_middle
    return (lambda: aten.sum.dim_IntList(x, [3]), lambda: aten.sum.dim_IntList(flat, [0]), float(2 * n),
            12.0 * n, 12.0 * n)


def _access_item(pattern: str, numel: int, run: int) -> Item:
    """One access pattern (:data:`ACCESS_PATTERNS`) with innermost run ``run``
    and its contiguous twin of the same size measured right after it (kind
    ``access_twin``): the run curve is the ratio of their bandwidths, so the
    memory curve's error and the host's load at that moment cancel."""

    def run_fn(job: Job, settings: Settings) -> list[ComputeSample]:
        fn, twin_fn, flops, nbytes, twin_bytes = _access_tensors(pattern, numel, run, job.device)
        t = measure(job, fn, settings)
        c = measure(job, twin_fn, settings)
        shape = f"{numel} run {run}"
        return [ComputeSample("access", pattern, shape, "fp32", flops, nbytes, t.seconds, t.spread, float(run)),
                ComputeSample("access_twin", pattern, shape, "fp32", flops, twin_bytes, c.seconds, c.spread)]

    return Item(f"access {pattern} {numel} run {run}", 0.2 + 16 * numel / 1e9, run_fn)


def reference_items(job: Job) -> list[Item]:
    """A few items of the fit set (launch, two GEMMs, adds and a copy), which
    the accuracy check measures again: how far they moved tells how much
    the machine itself changed since the calibration (other load on a
    shared host), apart from any model error."""
    dtype = primary_dtype(job)
    scale = 4 if job.is_cuda else 1
    return [_launch_item("add"), _matmul_item(256 * scale, 256 * scale, 256 * scale, dtype),
            _matmul_item(512 * scale, 512 * scale, 512 * scale, dtype), _memory_item("add", 2**16),
            _memory_item("add", 2**20), _memory_item("clone", 2**18)]


def compute_items(job: Job, mode: str) -> list[Item]:
    """The compute measurements of a calibration in ``mode`` (``full``,
    ``quick``, or ``tiny`` for tests), sized for ``job``'s device and memory."""
    sizes = _sizes(mode, job)
    dtype = primary_dtype(job)
    items = [_launch_item(op) for op in _LAUNCH_OPS]
    for s in sizes["square"]:
        items.append(_matmul_item(s, s, s, dtype))
    for s in sizes["rect"]:  # activations x weight, weight gradient (long k), wide output
        items += [_matmul_item(4 * s, s, s, dtype), _matmul_item(s, 4 * s, s, dtype), _matmul_item(s, s, 4 * s, dtype)]
    others = ["fp32", "tf32", "fp16"] if job.is_cuda else ["bf16", "fp16"]
    for other in others:
        for s in sizes["dtype"]:
            items.append(_matmul_item(s, s, s, other))
    for numel in sizes["memory"]:
        items += [_memory_item("add", numel), _memory_item("clone", numel)]
    for numel in sizes["fresh"]:  # both sides of glibc's 32 MiB mmap threshold: clone vs copy_ into a kept buffer
        items += [_memory_item("copy_", numel)] + ([] if numel in sizes["memory"] else [_memory_item("clone", numel)])
    for numel in sizes["vector"]:
        items += [_vector_item(op, numel) for op in _VECTOR_OPS]
    for bh, seq, head_dim in sizes["attention"]:
        items += [_attention_item(bh, seq, head_dim, dtype, False), _attention_item(bh, seq, head_dim, dtype, True)]
    for heads, seq, head_dim in sizes["attention_long"]:
        items += [_attention_item(heads, seq, head_dim, dtype, backward, heads=heads) for backward in (False, True)]
    for numel in sizes["access"]:
        for pattern, (_, runs) in ACCESS_PATTERNS.items():
            if mode == "tiny":
                runs = runs[:1]
            items += [_access_item(pattern, numel, run) for run in runs]
    return items

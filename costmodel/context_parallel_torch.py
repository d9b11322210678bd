r"""torch's own context parallelism, priced as it ran for torchtitan's published CP runs.

torchtitan's Table 2 (its December 2024 H100 page: torch ``1963fc8`` of 2024-12-23, torchtitan
``9dec370``) ran ``torch.distributed.tensor.experimental.context_parallel``: every
``scaled_dot_product_attention`` of a block becomes ``_templated_ring_attention`` (forward) and
``_templated_ring_attention_backward`` of ``torch/distributed/tensor/experimental/_attention.py``,
with its defaults: round-robin load balancing (rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r``
of ``2 cp``, already so reordered in the inputs, ``freqs_cis`` and labels by ``context_parallel``:
no row moves per attention), ``convert_to_f32=True`` and torchtitan's
``--experimental.context_parallel_rotate_method allgather`` (its default). That algorithm, per
rank ``r`` of ``cp`` and local chunks of ``c`` tokens (``2c`` local rows):

* **one SDPA call per step** ``i = 0 .. cp - 1``: ``i = 0`` the local ``2c x 2c`` block with
  ``is_causal=True`` (top-left aligned on the concatenated head and tail, exactly the visible
  pairs); ``i <= r`` all ``2c`` queries against the head chunk (``c`` keys) of rank ``r - i``,
  not causal; ``i > r`` the tail query chunk (``c``) against both chunks (``2c`` keys) of rank
  ``r - i mod cp``, not causal (``partial``). ``2c^2`` pairs a step after the first.
* **the merge** (``_SDPAMerger``, eager ops in fp32): each step's out converted to fp32, then
  ``out - sigmoid(lse_b - lse) * (out - out_b)`` (three passes over fp32 ``[B, H, 2c, D]``,
  half for a partial step, whose result ``_partial_update`` re-assembles with a ``torch.cat``),
  the result converted back at the end. ``lse`` traffic, ``D`` times smaller, is left out.
* **K/V exchange**: ``key.contiguous()``, ``value.contiguous()`` (torchtitan's K/V are transposed
  views: two copies), and a ``torch.cat`` of K and V at every step but the last (made even when
  the rotater uses only the first); ``allgather``: one ``all_gather`` of the ``cp`` blocks,
  issued at step 0, waited at step 1 (it overlaps the first call only); ``alltoall``: one
  ``permute`` a step, issued at step ``i`` and waited at ``i + 1``.
* **backward**: the same steps with ``_scaled_dot_product_flash_attention_backward``; K/V
  exchanged again the same way (the forward's gathered blocks are not kept); dQ, dK and dV
  accumulated in fp32 (``zeros_like(..., float32)``, ``+=`` of each step's 16-bit grads,
  ``_partial_update`` with a ``cat`` for the half-chunk updates); the dK/dV accumulator of the
  block in hand (``cat`` of the two, fp32) is passed one hop each step by ``permute`` (always
  the all-to-all rotater): issued after step ``i``'s accumulation, waited after step ``i + 1``'s
  kernel, the last one waited at the end (exposed), then converted to 16 bits.

Kernels are :func:`costmodel.compute.op_time_s` of kind ``attention`` / ``attention_backward``
at each call's FLOPs (``4 B H D pairs``, 2.5x backward) and bytes, so the profile's curve
prices the per-step shapes; the merges and accumulations are ``elementwise`` ops at the bytes
above (memory-bound); the collectives run beside them through :func:`costmodel.overlap.simulate`
with the profile's contention. The slowest rank's times, as ``ContextAttentionCost``.

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> shape = AttentionShape(batch=1, heads=32, kv_heads=32, seq_len=131072, head_dim=128)
>>> cost = price_torch_context_attention(shape, mesh=MeshSpec((2, 4)), cp_mesh_dim=1,
...                                      profile=load("h100-sxm-96gb-500w"))
>>> cost.variant, cost.forward_compute_s < cost.backward_compute_s
('torch_all_gather', True)
"""

from __future__ import annotations

from dataclasses import dataclass

from hw_profiles import HardwareProfile

from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.context_parallel import (BACKWARD_FLOPS_FACTOR, AttentionShape, ChunkLayout, ContextAttentionCost,
                                        ContextParallelError, memory_op_s)
from costmodel.mesh import MeshSpec
from costmodel.overlap import Transfer, simulate

__all__ = ["ROTATE_METHODS", "TorchStep", "torch_ring_steps", "price_torch_context_attention"]

ROTATE_METHODS = ("all_gather", "all_to_all")
"""torch's ``_RotateMethod`` for K/V (torchtitan: ``allgather``, its default, or ``alltoall``)."""


@dataclass(frozen=True, slots=True)
class TorchStep:
    """One iteration of torch's ring loop on one rank: one SDPA call (module docstring).

    >>> torch_ring_steps(2, 0, 8)[1]
    TorchStep(step=1, query_rows=2, key_rows=4, causal=False, partial=True)
    """

    step: int
    query_rows: int
    """Query tokens of the call: ``2c`` (both local chunks) or ``c`` (the tail only)."""
    key_rows: int
    """Key tokens of the call: ``2c``, or ``c`` (the sender's head chunk)."""
    causal: bool
    """The kernel's own causal flag (step 0 only)."""
    partial: bool
    """Only the tail query chunk: its merge and dQ update touch half the rows (``_partial_update``)."""

    @property
    def pairs(self) -> int:
        """(query, key) pairs the call computes."""
        if self.causal:
            return self.query_rows * (self.query_rows + 1) // 2
        return self.query_rows * self.key_rows


def torch_ring_steps(cp: int, rank: int, seq_len: int) -> tuple[TorchStep, ...]:
    """The SDPA calls of ``rank`` in torch's load-balanced ring loop (module docstring).

    >>> [(s.query_rows, s.key_rows, s.causal) for s in torch_ring_steps(4, 1, 32)]
    [(8, 8, True), (8, 4, False), (4, 8, False), (4, 8, False)]
    """
    layout = ChunkLayout(cp)
    if not 0 <= rank < cp:
        raise ContextParallelError(f"rank: {rank} is not in a CP group of {cp}")
    c = layout.chunk_len(seq_len)
    steps = [TorchStep(0, 2 * c, 2 * c, True, False)]
    for i in range(1, cp):
        if i <= rank:  # the sender's head chunk comes before both of ours
            steps.append(TorchStep(i, 2 * c, c, False, False))
        else:  # only our tail sees the sender's chunks, both of them
            steps.append(TorchStep(i, c, 2 * c, False, True))
    return tuple(steps)


def _kernel_s(shape: AttentionShape, step: TorchStep, profile: HardwareProfile, backward: bool) -> float:
    """One SDPA call (bytes as ``costmodel.context_parallel`` counts a part's)."""
    flops = 4.0 * shape.batch * shape.heads * step.pairs * shape.head_dim
    q_bytes = shape.batch * shape.heads * step.query_rows * shape.head_dim * shape.itemsize
    kv_bytes = 2 * shape.batch * shape.kv_heads * step.key_rows * shape.head_dim * shape.itemsize
    if backward:
        return op_time_s("attention_backward", flops=flops * BACKWARD_FLOPS_FACTOR,
                         bytes_accessed=4 * q_bytes + 2 * kv_bytes, dtype=shape.dtype, profile=profile)
    return op_time_s("attention", flops=flops, bytes_accessed=2 * q_bytes + kv_bytes, dtype=shape.dtype,
                     profile=profile)


@dataclass(frozen=True, slots=True)
class _Sizes:
    """Elements and itemsizes of one rank's tensors (``2c`` rows)."""

    q: float
    """Elements of the local q (and out, dout): ``B H 2c D``."""
    kv: float
    """Elements of the local K (and of V): ``B H_kv 2c D``."""
    item: int
    """Bytes per element of the inputs."""
    acc: int
    """Bytes per element of the merge and the gradient accumulators (4 with ``convert_to_f32``)."""

    def convert(self, n: float) -> float:
        """Bytes of a ``.to`` between the two dtypes of ``n`` elements (0: same dtype, no copy)."""
        return 0.0 if self.acc == self.item else n * (self.item + self.acc)


def _forward_ops(sizes: _Sizes, steps: tuple[TorchStep, ...], kernels: list[float], profile: HardwareProfile,
                 ) -> tuple[list[float], list[int], list[int]]:
    """(op seconds, position of each step's kernel, position of each step's K/V ``cat`` or kernel)."""
    q, a, kv_bytes = sizes.q, sizes.acc, 2 * sizes.kv * sizes.item
    ops = [memory_op_s(2 * kv_bytes, profile)]  # key.contiguous(), value.contiguous()
    kernel_at, step_at = [], []
    cp = len(steps)
    for step, kernel in zip(steps, kernels):
        step_at.append(len(ops))
        if step.step < cp - 1:
            ops.append(memory_op_s(2 * kv_bytes, profile))  # torch.cat([key.flatten(), value.flatten()])
        kernel_at.append(len(ops))
        ops.append(kernel)
        rows = q / 2 if step.partial else q
        if step.step == 0:
            merge = sizes.convert(q)  # the first result, converted, is the accumulator
        else:  # convert; out - out_b; sigmoid(.) * that; out - that: three fp32 passes of read 2, write 1
            merge = sizes.convert(rows) + 8 * rows * a + (2 * q * a if step.partial else 0.0)
        ops.append(memory_op_s(merge, profile))
    ops.append(memory_op_s(sizes.convert(q), profile))  # results(): out back to the input dtype
    return ops, kernel_at, step_at


def _backward_ops(sizes: _Sizes, steps: tuple[TorchStep, ...], kernels: list[float], profile: HardwareProfile,
                  ) -> tuple[list[float], list[int], list[int], list[int]]:
    """(op seconds, kernel positions, dK/dV accumulation positions, dQ positions)."""
    q, kv, a, s = sizes.q, sizes.kv, sizes.acc, sizes.item
    add = 2 * a + s  # acc += grad: read both, write the accumulator
    kv_bytes = 2 * kv * s
    # zeros_like(q, k, v) in fp32; K/V .contiguous()
    ops = [memory_op_s((q + 2 * kv) * a + 2 * kv_bytes, profile)]
    kernel_at, acc_at, dq_at = [], [], []
    cp = len(steps)
    for step, kernel in zip(steps, kernels):
        if step.step < cp - 1:
            ops.append(memory_op_s(2 * kv_bytes, profile))  # torch.cat of K and V for the rotater
        kernel_at.append(len(ops))
        ops.append(kernel)
        if step.step == 0 or step.partial:  # whole dK, dV += this step's
            kv_acc = 2 * kv * add
        else:  # _partial_update(add=True) of the head half, then its cat
            kv_acc = 2 * (kv / 2 * add + 2 * kv * a)
        acc_at.append(len(ops))
        ops.append(memory_op_s(kv_acc + 2 * (2 * kv * a), profile))  # and the cat of dK, dV for the pass
        dq_at.append(len(ops))
        ops.append(memory_op_s(q / 2 * add + 2 * q * a if step.partial else q * add, profile))
    # dQ, dK/dV back to the input dtype
    ops.append(memory_op_s(sizes.convert(q) + sizes.convert(2 * kv), profile))
    return ops, kernel_at, acc_at, dq_at


def price_torch_context_attention(shape: AttentionShape, *, mesh: MeshSpec, cp_mesh_dim: int,
                                  profile: HardwareProfile, rotate: str = "all_gather",
                                  convert_to_f32: bool = True) -> ContextAttentionCost:
    """torch's load-balanced ring attention, forward and backward, on mesh dim ``cp_mesh_dim``
    (module docstring); ``shape`` is the global attention (K/V heads as the call has them).

    >>> from hw_profiles import load
    >>> shape = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=8192, head_dim=128)
    >>> cost = price_torch_context_attention(shape, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=load("h100-sxm-80gb"))
    >>> cost.forward_pairs_by_rank[0] == cost.forward_pairs_by_rank[3]
    True
    """
    if rotate not in ROTATE_METHODS:
        raise ContextParallelError(f"rotate: {rotate!r} is not one of {', '.join(ROTATE_METHODS)}")
    if not 0 <= cp_mesh_dim < len(mesh.shape):
        raise ContextParallelError(f"cp_mesh_dim: {cp_mesh_dim} is not a mesh dim of a {len(mesh.shape)}-D mesh")
    cp = mesh.shape[cp_mesh_dim]
    local = shape.seq_len // cp
    acc = 4 if convert_to_f32 else shape.itemsize
    sizes = _Sizes(float(shape.batch * shape.heads * local * shape.head_dim),
                   float(shape.batch * shape.kv_heads * local * shape.head_dim), shape.itemsize, acc)
    local_kv = 2 * sizes.kv * shape.itemsize
    dims = (cp_mesh_dim,)
    gather_s = collective_time_s("all_gather", cp * local_kv, dims, mesh, profile) if cp > 1 else 0.0
    pass_s = collective_time_s("permute", local_kv, dims, mesh, profile) if cp > 1 else 0.0
    grad_pass_s = collective_time_s("permute", 2 * sizes.kv * acc, dims, mesh, profile) if cp > 1 else 0.0
    pairs, fwd_c, bwd_c, fwd_s, bwd_s = [], [], [], [], []
    for rank in range(cp):
        steps = torch_ring_steps(cp, rank, shape.seq_len)
        ops, kernel_at, step_at = _forward_ops(sizes, steps, [_kernel_s(shape, s, profile, False) for s in steps],
                                               profile)
        transfers = _kv_transfers(rotate, cp, kernel_at, step_at, gather_s, pass_s)
        fwd_s.append(simulate(ops, transfers, contention=profile.contention).step_s)
        fwd_c.append(sum(ops))
        ops, kernel_at, acc_at, dq_at = _backward_ops(sizes, steps, [_kernel_s(shape, s, profile, True)
                                                                     for s in steps], profile)
        transfers = _kv_transfers(rotate, cp, kernel_at, [k - (1 if s.step < cp - 1 else 0)
                                                          for k, s in zip(kernel_at, steps)], gather_s, pass_s)
        # dK/dV of step i leave after its dQ update's issue point and are waited at step i + 1's accumulation
        waits = acc_at[1:] + [len(ops) - 1]
        transfers += [Transfer(dq_at[i], waits[i], (grad_pass_s,)) for i in range(cp)] if cp > 1 else []
        transfers.sort(key=lambda t: (t.issue, t.wait))
        bwd_s.append(simulate(ops, transfers, contention=profile.contention).step_s)
        bwd_c.append(sum(ops))
        pairs.append(sum(s.pairs for s in steps))
    forward_comm = gather_s if rotate == "all_gather" else (cp - 1) * pass_s
    held = cp * local_kv if rotate == "all_gather" else 2 * local_kv
    return ContextAttentionCost(f"torch_{rotate}", True, tuple(pairs), max(fwd_c), max(bwd_c), forward_comm,
                                forward_comm + cp * grad_pass_s, max(fwd_s), max(bwd_s), int(held), 0,
                                int(held + 3 * 2 * sizes.kv * acc))


def _kv_transfers(rotate: str, cp: int, kernel_at: list[int], step_at: list[int], gather_s: float,
                  pass_s: float) -> list[Transfer]:
    """The K/V exchange: the all-gather issued before step 0's kernel and waited at step 1's start;
    or a permute issued before each step's kernel and waited at the next step's start."""
    if cp == 1:
        return []
    if rotate == "all_gather":
        return [Transfer(kernel_at[0], step_at[1], (gather_s,))]
    return [Transfer(kernel_at[i], step_at[i + 1], (pass_s,)) for i in range(cp - 1)]

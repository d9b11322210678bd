"""Byte and FLOP counts of the rules whose kernels touch less (or more) than
their operands, each against a hand count of what the kernel reads and
writes (autoshard.rules.compute's module docstring), through the registry as
the graph builder calls it."""

from __future__ import annotations

import torch

from autoshard.rules import load_rules
from autoshard.rules.core import TensorMeta

aten = torch.ops.aten
F32, I64 = torch.float32, torch.int64
RULES = load_rules()


def _m(*shape: int, dtype: torch.dtype = F32) -> TensorMeta:
    return TensorMeta(tuple(shape), dtype)


def _work(op, *args, **kwargs):
    return RULES.compute_kind(op, args, kwargs)


def test_nll_loss_forward_reads_one_logit_per_target_not_the_whole_input():
    x, t = _m(512, 2048), _m(512, dtype=I64)
    work = _work(aten.nll_loss_forward.default, x, t, None, 1, -100)
    # 512 targets (8 B) + 512 picked logits (4 B) + output and total_weight (two fp32 scalars)
    assert work.bytes_accessed == 512 * 8 + 512 * 4 + 2 * 4
    assert work.flops == 2 * 512
    weighted = _work(aten.nll_loss_forward.default, x, t, _m(2048), 1, -100)
    assert weighted.bytes_accessed == work.bytes_accessed + 512 * 4  # one weight per target


def test_nll_loss_backward_fills_the_gradient_and_writes_one_value_per_target():
    x, t = _m(512, 2048), _m(512, dtype=I64)
    work = _work(aten.nll_loss_backward.default, _m(), x, t, None, 1, -100, _m())
    # grad_input written once (zero fill), 512 targets read, 512 values written, grad_output and total_weight read
    assert work.bytes_accessed == 512 * 2048 * 4 + 512 * 8 + 512 * 4 + 2 * 4


def test_embedding_reads_the_looked_up_rows_not_the_table():
    table, idx = _m(50000, 256), _m(4, 128, dtype=I64)
    work = _work(aten.embedding.default, table, idx)
    rows = 4 * 128 * 256 * 4
    assert work.kind == "copy" and work.bytes_accessed == 2 * rows + 4 * 128 * 8  # read + write rows, indices


def test_embedding_backward_fills_the_table_gradient_then_adds_rows():
    grad, idx = _m(4, 128, 256), _m(4, 128, dtype=I64)
    work = _work(aten.embedding_dense_backward.default, grad, idx, 2048, -1, False)
    rows = 4 * 128 * 256 * 4
    # zero-fill [2048, 256], read grad_output, read and write the 512 rows added into, indices
    assert work.bytes_accessed == 2048 * 256 * 4 + rows + 2 * rows + 4 * 128 * 8
    assert work.flops == 4 * 128 * 256


def test_index_select_gather_and_index_read_only_what_they_select():
    x = _m(10000, 64)
    idx = _m(32, dtype=I64)
    assert _work(aten.index_select.default, x, 0, idx).bytes_accessed == 2 * 32 * 64 * 4 + 32 * 8
    gidx = _m(10000, 3, dtype=I64)
    assert _work(aten.gather.default, x, 1, gidx).bytes_accessed == 2 * 10000 * 3 * 4 + 10000 * 3 * 8
    assert _work(aten.index.Tensor, x, [idx]).bytes_accessed == 2 * 32 * 64 * 4 + 32 * 8


def test_scatters_copy_self_and_touch_the_indexed_elements():
    x, idx, src = _m(1000, 64), _m(10, 64, dtype=I64), _m(10, 64)
    copy_self, touched, index = 2 * 1000 * 64 * 4, 10 * 64 * 4, 10 * 64 * 8
    assert _work(aten.scatter.src, x, 0, idx, src).bytes_accessed == copy_self + index + 2 * touched
    assert _work(aten.scatter.value, x, 0, idx, 1.5).bytes_accessed == copy_self + index + 1 * touched
    assert _work(aten.scatter_add.default, x, 0, idx, src).bytes_accessed == copy_self + index + 3 * touched


def test_index_add_and_index_put_copy_self_and_read_modify_write_the_rows():
    x, idx = _m(1000, 64), _m(10, dtype=I64)
    rows = _m(10, 64)
    copy_self, source, index = 2 * 1000 * 64 * 4, 10 * 64 * 4, 10 * 8
    assert _work(aten.index_add.default, x, 0, idx, rows).bytes_accessed == copy_self + index + 3 * source
    assert _work(aten.index_put.default, x, [idx], rows, True).bytes_accessed == copy_self + index + 3 * source
    assert _work(aten.index_put.default, x, [idx], rows, False).bytes_accessed == copy_self + index + 2 * source


def test_slice_backward_and_pad_fill_the_output_and_copy_the_input_in():
    grad = _m(4, 128, 8, 16)
    work = _work(aten.slice_backward.default, grad, [4, 128, 8, 32], 3, 0, 16, 1)
    assert work.bytes_accessed == 4 * 128 * 8 * 32 * 4 + 2 * grad.nbytes
    pad = _work(aten.constant_pad_nd.default, _m(10, 10), [1, 1, 1, 1], 0.0)
    assert pad.bytes_accessed == 12 * 12 * 4 + 2 * 10 * 10 * 4
    into = _work(aten.slice_scatter.default, _m(8, 32), _m(8, 16), 1, 0, 16, 1)
    assert into.bytes_accessed == 2 * 8 * 32 * 4 + 2 * 8 * 16 * 4


def test_causal_attention_counts_the_pairs_under_the_diagonal():
    q = _m(2, 8, 128, 64)
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    dense = _work(op, q, q, q, 0.0, False)
    causal = _work(op, q, q, q, 0.0, True)
    assert dense.flops == 4 * 2 * 8 * 128 * 128 * 64
    assert causal.flops == 4 * 2 * 8 * (128 * 129 // 2) * 64  # query i sees keys 0..i
    backward = _work(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, q, q, q, q, q,
                     _m(2, 8, 128), 0.0, True)
    assert backward.kind == "attention_backward" and backward.flops == 2.5 * causal.flops


def test_pow_by_two_is_one_multiply_per_element():
    x = _m(4, 128, 256)
    assert _work(aten.pow.Tensor_Scalar, x, 2).flops == x.numel
    assert _work(aten.pow.Tensor_Scalar, x, 1.7).flops == 4 * x.numel


def test_a_tensor_made_from_sizes_reads_nothing_and_an_empty_one_writes_nothing():
    # the slice backward of a padded attention (new_empty of a 24 GiB tensor's shape) once priced
    # as reading the tensor it takes its dtype from
    big = _m(64, 64, 1024, 256)
    assert _work(aten.new_empty.default, big, [64, 64, 1024, 192]).bytes_accessed == 0
    assert _work(aten.new_empty_strided.default, big, [8, 8], [8, 1]).bytes_accessed == 0
    assert _work(aten.empty_like.default, big).bytes_accessed == 0
    assert _work(aten.new_zeros.default, big, [16, 32]).bytes_accessed == 16 * 32 * 4  # written once
    assert _work(aten.zeros_like.default, big).bytes_accessed == big.nbytes
    assert _work(aten.full.default, [4, 8], 1.5).bytes_accessed == 4 * 8 * 4

"""The rules' vocabulary: TensorMeta, OpCall binding, strategy text."""

import pytest
import torch

from autoshard.rules import OpCompute, TensorMeta
from autoshard.rules.calls import OutputsUnknown, make_call
from autoshard.rules.core import R, S, SingleDimStrategy

aten = torch.ops.aten


def test_op_call_binds_args_by_schema_name_with_defaults() -> None:
    x = TensorMeta((4, 8), torch.float32)
    call = make_call(aten.sum.dim_IntList, (x, [1]), {}, None)
    assert call.arg("dim") == [1] and call.arg("keepdim") is False
    assert call.outputs == (TensorMeta((4,), torch.float32),)


def test_place_orders_placements_like_the_tensor_inputs_and_skips_absent_ones() -> None:
    x, w = TensorMeta((4, 8), torch.float32), TensorMeta((8,), torch.float32)
    call = make_call(aten.native_layer_norm.default, (x, [8], None, w, 1e-5), {}, None)
    assert call.tensor_names() == ("input", "bias")
    assert call.place(R, input=S(0)) == (S(0), R)


def test_data_dependent_outputs_need_out_meta() -> None:
    with pytest.raises(OutputsUnknown, match="out_meta"):
        make_call(aten.nonzero.default, (TensorMeta((4,), torch.float32),), {}, None)


def test_single_dim_strategy_text_and_op_compute_checks_its_kind() -> None:
    assert str(SingleDimStrategy(S(0), (S(0), R))) == "S*(0) <- S*(0), R"
    with pytest.raises(ValueError, match="kind"):
        OpCompute("magic", 1.0, 1.0)

"""The published-runs benchmark's configurations: each builds as published, its figures agree
with each other, and the loss is torchtitan's (fp32 logits)."""

from __future__ import annotations

import math
from types import MethodType

import pytest

from benchmarks.published_runs import RUNS, _titan_forward
from benchmarks.solve_time import build_llama


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.key)
def test_each_run_builds_with_its_batch_and_a_batch_every_data_parallel_rank_divides(run) -> None:
    model, inputs = build_llama(run.config, run.global_batch, n_layers=1)
    assert tuple(inputs[0].shape) == (run.global_batch, run.seq_len)
    data_parallel = math.prod(m for m, name in zip(run.mesh, run.dim_names) if name != "tp")
    assert run.global_batch % data_parallel == 0
    # tokens/s/GPU and the step time are one figure: global tokens / (step x GPUs)
    assert run.global_batch * run.seq_len / (run.step_s * run.gpus) == pytest.approx(run.tokens_per_gpu_s, rel=1e-3)


def test_the_titan_loss_reads_fp32_logits() -> None:
    import torch

    from autoshard.trace import trace_joint

    model, inputs = build_llama("8b-8192", 1, n_layers=1)
    model.forward = MethodType(_titan_forward, model)
    traced = trace_joint(model, inputs)
    losses = [n for n in traced.nodes.values() if "nll_loss_forward" in str(n.op)]
    assert len(losses) == 1 and losses[0].inputs[0].dtype == torch.float32

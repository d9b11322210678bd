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


def test_the_2024_runs_trace_torchtitans_unfused_norm_on_the_same_weights() -> None:
    # torchtitan's own RMSNorm ran eager in the 2024-12 runs: for CUDA nn.RMSNorm traces as one fused
    # kernel, torchtitan's as its fp32 composite (pow, mean, rsqrt, ...), with the same parameters
    from autoshard.trace import trace_joint
    from benchmarks.published_runs import use_titan_norms

    assert [r.key for r in RUNS if r.titan_norm] == ["tt-8b-fsdp8", "tt-8b-fsdp128"]
    ops = {}
    for titan in (False, True):
        model, inputs = build_llama("8b-8192", 1, n_layers=1)
        names = [n for n, _ in model.named_parameters()]
        if titan:
            assert use_titan_norms(model) == 3  # attention_norm, ffn_norm, the final norm
        assert [n for n, _ in model.named_parameters()] == names
        traced = trace_joint(model, inputs, target_device="cuda")
        ops[titan] = {str(n.op) for n in traced.nodes.values()}
    assert any("_fused_rms_norm" in op for op in ops[False]) and not any("_fused_rms_norm" in op for op in ops[True])
    assert any("rsqrt" in op for op in ops[True])


# -- the one-H100 steps --------------------------------------------------------------------

def _readme_by_optimizer() -> dict[str, dict[str, tuple[float, ...]]]:
    """The README's "steps by optimizer" table: case -> column -> (ms, GB[, reserved GB])."""
    import re
    from pathlib import Path

    from benchmarks.published_runs import GPU_README

    text = (Path(__file__).resolve().parents[2] / GPU_README).read_text()
    head = next(line for line in text.splitlines() if line.startswith("| case | no optimizer"))
    columns = [c.strip() for c in head.strip("|").split("|")][1:]
    table = {}
    for line in text.splitlines():
        for case, key in (("LLaMA bf16", "llama-bf16"), ("LLaMA fp32", "llama-fp32"), ("MLP bf16", "mlp-bf16")):
            if line.startswith(f"| {case} (params"):
                cells = [c.strip() for c in line.strip("|").split("|")][1:]
                table[key] = {col: tuple(float(x) for x in re.findall(r"[0-9]+\.[0-9]+", cell))
                              for col, cell in zip(columns, cells) if cell != "-"}
    return table


def test_the_one_gpu_rows_are_the_measured_tables() -> None:
    """Every cell of the README's table by optimizer is a row, with its figures."""
    from benchmarks.published_runs import ONE_GPU

    names = {"no optimizer": "none", "SGD": "sgd", "AdamW foreach (default)": "foreach", "AdamW fused": "fused",
             "AdamW for-loop": "for-loop"}
    rows = {r.key: r for r in ONE_GPU}
    table = _readme_by_optimizer()
    assert set(table) == {"llama-bf16", "llama-fp32", "mlp-bf16"}
    cells = 0
    for case, columns in table.items():
        for column, figures in columns.items():
            row = rows[f"{case}-{names[column]}"]
            assert row.step_s == pytest.approx(figures[0] * 1e-3) and row.peak_bytes == pytest.approx(figures[1] * 1e9)
            assert row.reserved_bytes == (pytest.approx(figures[2] * 1e9) if len(figures) > 2 else None)
            cells += 1
    assert cells == len(ONE_GPU) - 1  # and the checkpointed step of the four cases' table


def _within(run, estimate) -> tuple[float, float]:
    return estimate["step_s"] / run.step_s - 1, estimate["peak_bytes"] / run.peak_bytes - 1


@pytest.mark.slow
def test_the_mlp_steps_on_one_h100_are_priced_within_the_targets() -> None:
    """The issue's targets, time within 10 % and memory within 5 %, on every MLP step (the
    foreach AdamW one measured 50.9 and 47.3 ms in two runs: the first is the row), and the
    steps by optimizer keep their measured order (fused < for-loop < foreach, SGD cheapest)."""
    from benchmarks.published_runs import ONE_GPU, one_gpu_rows

    rows = one_gpu_rows(tuple(r for r in ONE_GPU if r.key.startswith("mlp-")))
    assert len(rows) == 5
    for run, estimate in rows:
        time_error, memory_error = _within(run, estimate)
        assert abs(time_error) < 0.10 and abs(memory_error) < 0.05, (run.key, time_error, memory_error)
    step = {run.key.removeprefix("mlp-bf16-"): e["step_s"] for run, e in rows}
    assert step["none"] < step["sgd"] < step["fused"] < step["for-loop"] < step["foreach"]


@pytest.mark.slow
def test_the_llama_steps_on_one_h100_are_priced_within_the_targets() -> None:
    """Traced for cuda (the fused RMSNorm the GPU ran: the CPU composite held two fp32 copies per
    norm, +0.83 GB and ~10 ms), every LLaMA step, bf16 and fp32, is within 10 % / 5 % and keeps
    the measured order by optimizer (fp32 was +10.6 % while its attention was priced on the fp32
    units: CUDA's memory-efficient kernel multiplies fp32 as 3xTF32 on tensor cores)."""
    from benchmarks.published_runs import ONE_GPU, one_gpu_rows

    keys = ("llama-bf16-", "llama-fp32-foreach")
    rows = one_gpu_rows(tuple(r for r in ONE_GPU if r.key.startswith(keys)))
    assert len(rows) == 7
    for run, estimate in rows:
        time_error, memory_error = _within(run, estimate)
        assert abs(time_error) < 0.10 and abs(memory_error) < 0.05, (run.key, time_error, memory_error)
    step = {run.key.removeprefix("llama-bf16-"): e["step_s"] for run, e in rows}
    assert step["none"] < step["sgd"] < step["fused"] < step["for-loop"] < step["foreach"]

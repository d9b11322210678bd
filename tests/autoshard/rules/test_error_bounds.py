"""Kernel-independent comparisons of the matmul family: the validator's
error bound holds for any summation order, thread count and BLAS path, and
its verdict does not depend on what earlier tests left behind."""

from __future__ import annotations

import pytest
import torch

from costmodel.placements import Replicate, Shard
from autoshard.rules import load_rules
from autoshard.rules.core import OpStrategy
from autoshard.rules.error_bounds import einsum_error_bound
from autoshard.rules.registry import SampleInput
from autoshard.validation.validator import check_strategy, validate_rule

aten = torch.ops.aten
REGISTRY = load_rules()
MATMUL_FAMILY = [op for op in REGISTRY.ops() if REGISTRY.rule_for(op).family == "matmul"]
FMIN = torch.finfo(torch.float32).min


def test_bound_holds_for_every_summation_order_of_a_dot_product() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 64, generator=gen) * 1e3
    b = torch.randn(64, 1, generator=gen)
    exact = (a.double() @ b.double()).item()
    bound = einsum_error_bound("mk,kn->mn")(aten.mm.default, (a, b), {})[0].item()
    products = (a[0] * b[:, 0]).tolist()
    for trial in range(50):  # sequential float32 sums in random orders
        order = torch.randperm(64, generator=gen).tolist()
        total = torch.zeros((), dtype=torch.float32)
        for i in order:
            total = total + torch.tensor(products[i], dtype=torch.float32)
        assert abs(total.item() - exact) <= bound


def test_bound_is_infinite_where_a_kernel_may_overflow_and_finite_elsewhere() -> None:
    a = torch.randn(4, 12, generator=torch.Generator().manual_seed(1))
    a[0, 0] = FMIN  # 2 * FMIN overflows when a kernel scales mat1 by alpha first
    b, c = torch.randn(12, 12), torch.randn(4, 12)
    bound = einsum_error_bound("mk,kn->mn", bias=True)(aten.addmm.default, (c, a, b), {"beta": 0.5, "alpha": 2.0})[0]
    assert torch.isinf(bound[0]).all() and torch.isfinite(bound[1:]).all()


def test_addmm_near_the_float_range_passes_whichever_kernel_path_the_shards_take() -> None:
    # MKL computes (alpha * A) @ B for at most 3 rows and alpha * (A @ B) for more:
    # the 2-row shards overflow where the 4-row reference does not
    rule = REGISTRY.rule_for(aten.addmm.default)
    gen = torch.Generator().manual_seed(2)
    bias, a, b = torch.randn(4, 12, generator=gen), torch.randn(4, 12, generator=gen), torch.randn(12, 12, generator=gen) * 0.1
    a[0, 0] = FMIN
    sample = SampleInput((bias, a, b), {"beta": 0.5, "alpha": 2.0})
    reference = [torch.addmm(bias, a, b, beta=0.5, alpha=2.0)]
    rows = OpStrategy(((Shard(0),),), ((Shard(0),), (Shard(0),), (Replicate(),)))
    assert check_strategy(rule, sample, rows, (2,), reference, gen) is None
    # the same comparison still catches a wrong layout: rows of A as columns of C
    wrong = OpStrategy(((Shard(1),),), ((Shard(1),), (Shard(0),), (Replicate(),)))
    assert check_strategy(rule, sample, wrong, (2,), reference, gen) is not None


def _change_global_state() -> None:
    """What earlier tests leave behind: default dtype, RNG, threads."""
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(12345)
    torch.set_num_threads(3)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_matmul_family_validates_under_any_thread_count_and_after_global_state_changes(threads: int) -> None:
    saved = (torch.get_default_dtype(), torch.get_num_threads())
    try:
        _change_global_state()
        torch.set_default_dtype(saved[0])
        torch.set_num_threads(threads)
        for op in MATMUL_FAMILY:
            report = validate_rule(REGISTRY.rule_for(op), REGISTRY, cases=5, seed=7, threads=None)
            assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    finally:
        torch.set_default_dtype(saved[0])
        torch.set_num_threads(saved[1])


@pytest.mark.slow
def test_matmul_samples_are_the_same_in_every_process() -> None:
    # the sizes were drawn per letter in a set's order, i.e. per PYTHONHASHSEED
    import os
    import subprocess
    import sys

    from autoshard.rules.samples import Sampler

    here = [tuple(t.shape) for s in REGISTRY.rule_for(aten.addmm.default).samples(Sampler(3)) for t in s.args]
    code = ("from autoshard.rules import load_rules; import torch; from autoshard.rules.samples import Sampler; "
            "r = load_rules().rule_for(torch.ops.aten.addmm.default); "
            "print([tuple(t.shape) for s in r.samples(Sampler(3)) for t in s.args])")
    seed = "7" if os.environ.get("PYTHONHASHSEED") != "7" else "8"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONHASHSEED": seed})
    assert done.stdout.strip() == str(here), done.stderr[-500:]

"""``compile=True``: the per-rank step compiled by inductor, on 2 real gloo ranks.

One MLP block sharded FSDP-style (parameter all-gathers and gradient
reduce-scatters in the compiled graph) takes three SGD steps through the
eager runtime and through the compiled one: losses and parameters agree
within fp32 tolerance, and the compiled graph really ran. Then the same with
``CXX=/nonexistent`` (no C++ compiler, a fresh inductor cache): one warning
line naming the failure, the uncompiled graph runs, the losses are the eager
ones, and nothing hangs (the spawn has a deadline).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from gloo_ranks import local_of, spawn

from autoshard.search.solve import prepare, solve_prepared
from examples.models import mlp

pytestmark = pytest.mark.slow

ONE_BLOCK = {"n_layers": 1}
STEPS = 3


def compile_jobs(rank: int, world: int, plan: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logging.getLogger("autoshard").addHandler(Keep(level=logging.WARNING))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out: dict[str, Any] = {}
    for mode in ("eager", "compile"):
        model, inputs = mlp.tiny(**ONE_BLOCK)
        sharded = shard(model, mesh, plan, inputs, compile=mode == "compile")
        opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
        losses = []
        for _ in range(STEPS):
            loss = sharded(*inputs)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
        graph = sharded._runner.step_graph
        out[mode] = {"losses": losses, "compiled": bool(graph is not None and graph.compiled),
                     "params": {n: local_of(p).detach().clone() for n, p in sharded.named_parameters()}}
    out["warnings"] = messages
    return out


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile")
    model, inputs = mlp.tiny(device="meta", **ONE_BLOCK)
    plan = solve_prepared(prepare(model, inputs, (2,), ("dp",), profile="cpu-gloo"), baseline="fsdp", time_limit=5)
    assert any(s.collective == "all_gather" for r in plan.redistributions for s in r.steps)
    plan.save(tmp / "fsdp.json")
    return tmp


def _assert_same(res: dict[str, Any]) -> None:
    for got, want in zip(res["compile"]["losses"], res["eager"]["losses"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, want in res["eager"]["params"].items():
        torch.testing.assert_close(res["compile"]["params"][name], want, rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_step_gives_the_eager_losses_and_parameters(plan_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(plan_path / "inductor-cache"))
    results = spawn(2, compile_jobs, (str(plan_path / "fsdp.json"),), plan_path / "ok", timeout=400)
    for res in results:
        assert res["compile"]["compiled"], "the compiled graph did not run"
        assert not res["warnings"]
        _assert_same(res)


def test_without_a_cxx_compiler_it_warns_once_and_runs_uncompiled(plan_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(plan_path / "empty-cache"))  # no compiled artifact to reuse
    # fresh interpreters: inductor reads CXX when it is imported, which the fork server's ranks already did
    results = spawn(2, compile_jobs, (str(plan_path / "fsdp.json"),), plan_path / "nocxx", timeout=200,
                    start_method="spawn")
    for res in results:
        assert not res["compile"]["compiled"]
        assert len(res["warnings"]) == 1 and "compile=True" in res["warnings"][0]
        assert "\n" not in res["warnings"][0] and "compiler" in res["warnings"][0].lower()
        _assert_same(res)

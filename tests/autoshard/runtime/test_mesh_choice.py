"""``autoshard(model, example_inputs=..., devices=4)`` on 4 gloo ranks: no mesh given.

Rank 0 searches the mesh layouts of 4 ranks (``4``, ``2x2``) under a memory
limit that forces sharding; every rank receives the same plan, builds the
plan's mesh (shape and dim names) and runs a step whose loss and gradients
equal the single-device model's. Started again, the chosen layout comes from
the layout cache; a ``devices`` that is not the job's size is refused on every
rank.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from gloo_ranks import short_profile_correction, spawn, whole

pytestmark = pytest.mark.slow


def _error(call) -> tuple[str, str] | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test reads type and message
        return type(exc).__name__, str(exc)
    return None


def search_jobs(rank: int, world: int, cache: str, limit: float) -> dict[str, Any]:
    from autoshard import autoshard
    from examples.models import mlp

    short_profile_correction()
    out: dict[str, Any] = {}
    model, inputs = mlp.tiny()
    reference = copy.deepcopy(model)
    sharded = autoshard(model, example_inputs=inputs, memory_limit=limit, time_limit=60, cache_dir=cache)
    mesh = sharded.mesh
    out["first"] = {"source": sharded.plan_source, "plan": sharded.plan.to_dict(),
                    "mesh": (tuple(mesh.shape), tuple(mesh.mesh_dim_names))}
    loss = sharded(*inputs)
    loss.backward()
    ref_loss = reference(*inputs)
    ref_loss.backward()
    ref = dict(reference.named_parameters())
    out["step"] = {"loss": (loss.detach(), ref_loss.detach()),
                   "grads": {name: (whole(p.grad), ref[name].grad) for name, p in sharded.named_parameters()}}
    again = autoshard(mlp.tiny()[0], example_inputs=inputs, memory_limit=limit, time_limit=60, cache_dir=cache)
    out["second"] = {"source": again.plan_source, "plan": again.plan.to_dict()}
    out["devices"] = _error(lambda: autoshard(mlp.tiny()[0], example_inputs=inputs, devices=8, cache_dir=False))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from autoshard.search.api import solve
    from examples.models import mlp

    tmp = tmp_path_factory.mktemp("mesh_choice")
    full = solve(*mlp.tiny(device="meta"), (2, 2), profile="cpu-gloo", time_limit=20).estimate.peak_memory_bytes
    return spawn(4, search_jobs, (str(tmp / "cache"), full * 0.75), tmp / "ranks", timeout=300)


def test_every_rank_gets_the_searched_plan_and_builds_its_mesh(run) -> None:
    plans = [res["first"]["plan"] for res in run]
    assert all(p == plans[0] for p in plans)
    search = plans[0]["options"]["mesh_search"]
    assert [r["shape"] for r in search["layouts"]] == [[4], [2, 2]]
    chosen = next(r for r in search["layouts"] if r["chosen"])
    for res in run:
        assert res["first"]["source"] == "solved"
        assert res["first"]["mesh"] == (tuple(chosen["shape"]), tuple(chosen["dim_names"]))
    assert plans[0]["fingerprint"]["mesh"] == {"shape": chosen["shape"], "dim_names": chosen["dim_names"]}
    assert any(p.replace("R", "") for p in plans[0]["params"].values()), "the memory limit should force sharding"


def test_loss_and_gradients_match_one_device(run) -> None:
    for rank, res in enumerate(run):
        loss, ref_loss = res["step"]["loss"]
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6)
        for name, (got, want) in res["step"]["grads"].items():
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=lambda m: f"rank {rank} {name}: {m}")


def test_second_start_takes_the_layouts_from_the_cache(run) -> None:
    for res in run:
        assert res["second"]["source"] == "cache"
        assert res["second"]["plan"]["fingerprint"] == res["first"]["plan"]["fingerprint"]
        assert all(r["cached"] for r in res["second"]["plan"]["options"]["mesh_search"]["layouts"])


def test_devices_other_than_the_job_are_refused_on_every_rank(run) -> None:
    for res in run:
        kind, message = res["devices"]
        assert kind == "MeshSizeError" and "devices=8" in message and "4 ranks" in message

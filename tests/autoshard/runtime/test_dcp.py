"""``torch.distributed.checkpoint`` across meshes and plans, on 4 real gloo processes.

The MLP sharded on a 2x2 mesh (FSDP+TP plan: parameters are DTensors with
2-D placements) takes one AdamW step and is saved with ``get_state_dict`` +
``dcp.save``; a fresh model with other weights, sharded on a 1-D mesh of 4
(FSDP plan), loads it with ``dcp.load`` + ``set_state_dict``: its parameters
and its optimizer state (``step``, ``exp_avg``, ``exp_avg_sq``) equal the
saved ones, and one more step on each mesh gives the same parameters.

Resume: a run of AdamW steps (each step its own batch) stopped after step
``K`` and resumed from its checkpoint, by a fresh process state with other
weights, continues with the losses of the uninterrupted run: on the same 2x2
mesh and plan, and on a 1-D mesh of 4 with the FSDP plan.

Plain parameters: the DDP plan on 4 ranks keeps its (replicated) parameters
plain tensors, as DDP does; its checkpoint loads into the 2x2 FSDP+TP plan's
DTensors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import placement_names, spawn, whole

from autoshard.search.solve import prepare, solve_prepared
from examples.models import mlp

pytestmark = pytest.mark.slow


def _full(value: Any) -> Any:
    return whole(value).detach().clone()


def _snapshot(module: Any, opt: Any) -> dict[str, Any]:
    """Whole parameters and optimizer state by parameter name (what a checkpoint holds)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(module, opt)
    return {"params": {k: _full(v) for k, v in msd.items()},
            "optim": {name: {k: _full(v) for k, v in state.items()} for name, state in osd["state"].items()},
            "placements": {n: placement_names(p) for n, p in module.named_parameters()}}


def _step(module: Any, opt: Any, inputs: tuple) -> None:
    module(*inputs).backward()
    opt.step()
    opt.zero_grad()


def dcp_jobs(rank: int, world: int, ckpt: str, plan_2x2: str, plan_4: str, plan_ddp: str) -> dict[str, Any]:
    """Save on 2x2, load on 4 (module docstring); both snapshots, and both after one more step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    model, inputs = mlp.tiny()
    saved = shard(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), plan_2x2, inputs)
    opt = torch.optim.AdamW(saved.parameters(), lr=1e-2)
    _step(saved, opt, inputs)
    msd, osd = get_state_dict(saved, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)

    other, _ = mlp.tiny(seed=1)  # other weights: only the checkpoint can make them equal
    loaded = shard(other, init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)), plan_4, inputs)
    opt4 = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    before = _snapshot(loaded, opt4)["params"]
    msd4, osd4 = get_state_dict(loaded, opt4)
    state = {"model": msd4, "optim": osd4}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(loaded, opt4, model_state_dict=state["model"], optim_state_dict=state["optim"])

    out = {"saved": _snapshot(saved, opt), "loaded": _snapshot(loaded, opt4), "before": before}
    _step(saved, opt, inputs)
    _step(loaded, opt4, inputs)
    out["saved+1"], out["loaded+1"] = _snapshot(saved, opt), _snapshot(loaded, opt4)

    # plain (DDP) parameters saved, loaded as the 2x2 plan's DTensors
    plain, _ = mlp.tiny(seed=2)
    plain = shard(plain, init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)), plan_ddp, inputs)
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    _step(plain, opt_plain, inputs)
    msd, osd = get_state_dict(plain, opt_plain)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt + "-plain")
    into, _ = mlp.tiny(seed=3)
    into = shard(into, init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), plan_2x2, inputs)
    opt_into = torch.optim.AdamW(into.parameters(), lr=1e-2)
    msd, osd = get_state_dict(into, opt_into)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt + "-plain")
    set_state_dict(into, opt_into, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out["plain"], out["plain_loaded"] = _snapshot(plain, opt_plain), _snapshot(into, opt_into)
    out["plain_flag"] = plain.plain_parameters
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcp")
    model, inputs = mlp.tiny(device="meta")
    solve_prepared(prepare(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo"),
                   baseline="fsdp+tp").save(tmp / "2x2.json")
    four = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo")
    solve_prepared(four, baseline="fsdp").save(tmp / "4.json")
    solve_prepared(four, baseline="ddp").save(tmp / "ddp.json")
    return spawn(4, dcp_jobs, (str(tmp / "ckpt"), str(tmp / "2x2.json"), str(tmp / "4.json"), str(tmp / "ddp.json")),
                 tmp / "ranks", timeout=120)


def _assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    for name in want:
        if isinstance(want[name], dict):
            _assert_same(got[name], want[name], f"{what} {name}")
        else:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{what} {name}: {m}")


def test_checkpoint_from_2x2_loads_on_a_mesh_of_4_with_another_plan(run):
    for rank, res in enumerate(run):
        saved, loaded = res["saved"], res["loaded"]
        assert saved["placements"] != loaded["placements"], "the two plans should lay out parameters differently"
        assert all(len(p) == 2 for p in saved["placements"].values())
        assert all(len(p) == 1 for p in loaded["placements"].values())
        assert any(not torch.equal(res["before"][k], v) for k, v in saved["params"].items()), "weights equal before load"
        _assert_same(loaded["params"], saved["params"], f"rank {rank} parameter")
        assert saved["optim"] and all({"step", "exp_avg", "exp_avg_sq"} <= s.keys() for s in saved["optim"].values())
        _assert_same(loaded["optim"], saved["optim"], f"rank {rank} optimizer state")


def test_a_ddp_plans_plain_parameters_load_into_another_plans_dtensors(run):
    for rank, res in enumerate(run):
        assert res["plain_flag"] and set(res["plain"]["placements"].values()) == {("plain",)}
        assert all(len(p) == 2 for p in res["plain_loaded"]["placements"].values())
        _assert_same(res["plain_loaded"]["params"], res["plain"]["params"], f"rank {rank} parameter")
        _assert_same(res["plain_loaded"]["optim"], res["plain"]["optim"], f"rank {rank} optimizer state")


def test_training_continues_alike_on_both_meshes(run):
    for rank, res in enumerate(run):
        _assert_same(res["loaded+1"]["params"], res["saved+1"]["params"], f"rank {rank} after one more step")
        _assert_same(res["loaded+1"]["optim"], res["saved+1"]["optim"], f"rank {rank} optimizer after one more step")


RESUME_AT, RESUME_STEPS = 2, 3


def _batch(inputs: tuple, step: int) -> tuple:
    """Step ``step``'s batch: the example inputs shifted (same shapes, other values)."""
    return tuple(x + 0.05 * step for x in inputs)


def _train(module: Any, opt: Any, inputs: tuple, steps: range) -> list[torch.Tensor]:
    losses = []
    for k in steps:
        loss = module(*_batch(inputs, k))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    return losses


def resume_jobs(rank: int, world: int, ckpt: str, plan_2x2: str, plan_4: str) -> dict[str, Any]:
    """Uninterrupted losses, and the losses after resuming on 2x2 and on 4 (module docstring)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    mesh_2x2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model, inputs = mlp.tiny()
    whole = shard(model, mesh_2x2, plan_2x2, inputs)
    opt = torch.optim.AdamW(whole.parameters(), lr=1e-2)
    out = {"uninterrupted": _train(whole, opt, inputs, range(RESUME_AT + RESUME_STEPS))}

    model, _ = mlp.tiny()
    first = shard(model, mesh_2x2, plan_2x2, inputs)
    opt = torch.optim.AdamW(first.parameters(), lr=1e-2)
    out["before"] = _train(first, opt, inputs, range(RESUME_AT))
    msd, osd = get_state_dict(first, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)

    for label, mesh, plan in (("same mesh", mesh_2x2, plan_2x2),
                              ("other mesh", init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)), plan_4)):
        other, _ = mlp.tiny(seed=1)  # other weights: only the checkpoint can make the losses match
        resumed = shard(other, mesh, plan, inputs)
        opt = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
        msd, osd = get_state_dict(resumed, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(resumed, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        out[label] = _train(resumed, opt, inputs, range(RESUME_AT, RESUME_AT + RESUME_STEPS))
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    model, inputs = mlp.tiny(device="meta")
    solve_prepared(prepare(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo"),
                   baseline="fsdp+tp").save(tmp / "2x2.json")
    solve_prepared(prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo"), baseline="fsdp").save(tmp / "4.json")
    return spawn(4, resume_jobs, (str(tmp / "ckpt"), str(tmp / "2x2.json"), str(tmp / "4.json")), tmp / "ranks",
                 timeout=180)


@pytest.mark.parametrize("where", ["same mesh", "other mesh"])
def test_a_resumed_run_continues_with_the_uninterrupted_losses(resumed, where):
    for rank, res in enumerate(resumed):
        whole = res["uninterrupted"]
        torch.testing.assert_close(torch.stack(res["before"]), torch.stack(whole[:RESUME_AT]), rtol=0, atol=0)
        got = torch.stack(res[where])
        torch.testing.assert_close(got, torch.stack(whole[RESUME_AT:]), rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"rank {rank}, {where}: {m}")
        assert len(set(float(x) for x in whole)) == len(whole), "the losses should change from step to step"

"""A sharded step against one device, rank by rank: the check behind the runtime's
equivalence tests (``tests/autoshard/runtime/``) and ``benchmarks/gpu_check.py`` part b.

:func:`equivalence` is a rank's worker (run it with
:func:`benchmarks.common.gloo.spawn`): for each job (model, plan file) it
shards the model on the mesh, runs one step (``loss.backward()``) and reports,
per parameter, this rank's gradient shard next to the same shard of the
single-device eager gradient, plus the collective trace (kind, mesh dims,
bytes, group ranks, plan edge, and the schedule positions where each
collective was issued and waited). :func:`assert_matches_one_device` and
:func:`planned_collectives_issued` read those results: equal to one device,
and exactly the plan's collectives.

>>> job = {"label": "llama-2x2", "factory": "llama3.tiny", "plan": "plan.json", "kwargs": {"batch_size": 4}}
>>> # results = spawn(4, equivalence, ([(((2, 2), ("dp", "tp")), [job])],), Path(tmp))
>>> # assert_matches_one_device(results, "llama-2x2")
"""

from __future__ import annotations

import copy
import os
import time
from collections import Counter
from typing import Any

import torch

from benchmarks.common.models import load, loss_of

__all__ = ["equivalence", "assert_matches_one_device", "planned_collectives_issued", "recompute_positions",
           "local_of", "placement_names"]


def equivalence(rank: int, world: int, meshes: list[tuple[tuple[tuple[int, ...], tuple[str, ...]], list[dict[str, Any]]]],
                errors: dict[tuple[int, ...], list[tuple[str, str, dict, str]]] | None = None,
                strided: bool = True, device: str = "cpu") -> dict[str, Any]:
    """One step of every job through ``autoshard.runtime.shard`` vs eager
    single-device autograd, for each ``((mesh_shape, dim_names), jobs)``; also
    ``strided`` (unless ``strided=False``): :func:`_strided` on the first 2-D mesh; and for each
    ``errors[mesh_shape]`` entry ``(label, factory, kwargs, plan)``, the error
    ``shard`` raises (None if it raises none). ``device``: where the ranks' tensors
    live (``cuda``: every rank on the current GPU, gloo moving CUDA tensors, as
    ``benchmarks/gpu_check.py`` runs 4 ranks on one GPU); results come back on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    out: dict[str, Any] = {}
    traced: dict[str, Any] = {}
    for (mesh_shape, dim_names), jobs in meshes:
        mesh = init_device_mesh(device, mesh_shape, mesh_dim_names=dim_names)
        out.update(_jobs(mesh, tuple(mesh_shape), jobs, traced, torch.device(device)))
        if strided and len(mesh_shape) == 2 and "strided" not in out:
            out["strided"] = _strided(mesh, ["_S(0,sf=2)S(0)", "S(0)S(1)", "_S(1,sf=2)S(1)"])
        for label, factory, kwargs, plan in (errors or {}).get(tuple(mesh_shape), []):
            model, inputs = load(factory, kwargs)
            try:
                shard(model, mesh, plan, inputs)
                out[label] = None
            except Exception as exc:  # noqa: BLE001 - the test reads the message
                out[label] = f"{type(exc).__name__}: {exc}"
    return out


def local_of(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; a plain tensor (a replicated parameter) itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def placement_names(t: torch.Tensor) -> tuple[str, ...]:
    """A DTensor's placements as text; ``("plain",)`` for a plain tensor."""
    from torch.distributed.tensor import DTensor

    return tuple(str(x) for x in t.placements) if isinstance(t, DTensor) else ("plain",)


def _jobs(mesh: Any, mesh_shape: tuple[int, ...], jobs: list[dict[str, Any]],
          traced: dict[str, Any] | None = None, device: torch.device = torch.device("cpu")) -> dict[str, Any]:
    """``traced``: a cache of joint graphs by model (factory and kwargs), shared
    by the jobs of one model (tracing is the slow part of a tiny job)."""
    from torch.distributed.tensor import DTensor

    from costmodel.placements import Replicate

    from autoshard.runtime import TRACE_ENV, local_slice, shard
    from autoshard.runtime.execute import placements_of
    from autoshard.trace import trace_joint

    coord = tuple(mesh.get_coordinate())
    out: dict[str, Any] = {}
    traced = {} if traced is None else traced
    for job in jobs:
        start = time.perf_counter()
        model, inputs = load(job["factory"], job.get("kwargs", {}))
        if device.type != "cpu":
            model = model.to(device)
            inputs = {k: v.to(device) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(
                x.to(device) for x in inputs)
        key = repr((job["factory"], sorted(job.get("kwargs", {}).items())))
        if key not in traced:
            traced[key] = trace_joint(model, inputs, target_device=device.type)
        graph = traced[key]
        reference = copy.deepcopy(model)
        if job.get("seed") is not None:  # random ops: both runs draw from the same generator state
            torch.manual_seed(job["seed"])
        ref_loss = loss_of(reference, inputs)
        ref_loss.backward()
        ref_params = dict(reference.named_parameters())
        if job.get("trace") == "env":
            os.environ[TRACE_ENV] = "1"
            sharded = shard(model, mesh, job["plan"], inputs, traced=graph)
            del os.environ[TRACE_ENV]
        else:
            sharded = shard(model, mesh, job["plan"], inputs, trace_collectives=True,
                            local_inputs=bool(job.get("local_inputs")), traced=graph,
                            plain_replicated=job.get("plain_replicated", True))
        if job.get("seed") is not None:
            torch.manual_seed(job["seed"])
        if job.get("local_inputs"):  # the data loader yields each rank's shard
            loss = sharded(*[local_slice(x, sharded.input_placements[name], mesh_shape, coord)
                             for name, x in zip(sharded.input_placements, inputs)])
        else:
            loss = loss_of(sharded, inputs)
        loss.backward()
        trace = [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                 for r in sharded.collective_trace]
        params = {}
        for name, p in sharded.named_parameters():
            pl = placements_of(sharded.plan.params[name], len(mesh_shape))
            params[name] = {
                # DTensors in the plan's placements; plain tensors when the plan replicates every parameter
                "kind_ok": (isinstance(p, DTensor) and (p.grad is None or isinstance(p.grad, DTensor)))
                if not sharded.plain_parameters else
                (not isinstance(p, DTensor) and not isinstance(p.grad, DTensor)
                 and all(isinstance(x, Replicate) for x in pl)),
                "placements": placement_names(p),
                "grad_placements": None if p.grad is None else placement_names(p.grad),
                "grad": None if p.grad is None else local_of(p.grad).clone(),
                # frozen parameters (Whisper's sinusoidal positions) have no gradient in either run
                "want": None if ref_params[name].grad is None else local_slice(ref_params[name].grad, pl, mesh_shape, coord),
                "local": local_of(p).detach().clone(),
                "want_local": local_slice(ref_params[name].detach(), pl, mesh_shape, coord),
            }
        steps = []
        norms = None
        if job.get("adamw_steps"):
            # gradient clipping sees the whole gradient (DTensor norms reduce over the mesh)
            norm = torch.nn.utils.clip_grad_norm_(sharded.parameters(), max_norm=1e9)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            norms = (norm.detach().clone(), torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=1e9))
            # a few optimizer steps: parameters must follow the single-device model
            opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
            ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
            opt.step()
            ref_opt.step()
            for _ in range(job["adamw_steps"] - 1):
                opt.zero_grad()
                ref_opt.zero_grad()
                loss_of(sharded, inputs).backward()
                loss_of(reference, inputs).backward()
                opt.step()
                ref_opt.step()
            ref_now = dict(reference.named_parameters())
            for name, p in sharded.named_parameters():
                pl = placements_of(sharded.plan.params[name], len(mesh_shape))
                steps.append((name, local_of(p).detach().clone(),
                              local_slice(ref_now[name].detach(), pl, mesh_shape, coord)))
        out[job["label"]] = {
            "loss": loss.detach().clone(),
            "ref_loss": ref_loss.detach().clone(),
            "names": [n for n, _ in sharded.named_parameters()],
            "ref_names": [n for n, _ in reference.named_parameters()],
            "state_dict_keys": sorted(sharded.state_dict()),
            "plain_parameters": sharded.plain_parameters,
            "ref_state_dict_keys": sorted(reference.state_dict()),
            "params": params,
            "trace": trace,
            "trace_last": [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                           for r in sharded.collective_trace],
            "adamw": steps,
            "graph": sharded._runner.step_graph is not None,
            "recompute_at": recompute_positions(graph, sharded.plan),
            "peak_bytes": sharded._runner.last_step_peak_bytes,
            "grad_norms": norms,
            "seconds": time.perf_counter() - start,
        }
    return out


def _strided(mesh: Any, placements: list[str]) -> dict[str, bool]:
    """Our local slicing of each placement, wrapped as a DTensor, gathers back to the whole tensor."""
    from torch.distributed.tensor import DTensor

    from autoshard.runtime import local_slice, to_dtensor_placements
    from autoshard.runtime.execute import placements_of

    mesh_shape, coord = tuple(mesh.shape), tuple(mesh.get_coordinate())
    x = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    out = {}
    for text in placements:
        pl = placements_of(text, len(mesh_shape))
        local = local_slice(x, pl, mesh_shape, coord)
        dt = DTensor.from_local(local, mesh, to_dtensor_placements(pl), run_check=False, shape=x.shape, stride=x.stride())
        out[text] = bool(torch.equal(dt.full_tensor(), x))
    return out


def assert_matches_one_device(results: list[dict[str, Any]], label: str) -> None:
    """Every rank's loss, gradient shards (in their parameter's placement), parameter
    shards, names and state_dict keys for job ``label`` equal the single-device run."""
    for rank, res in enumerate(results):
        r = res[label]
        torch.testing.assert_close(r["loss"], r["ref_loss"], rtol=1e-4, atol=1e-6)
        assert r["names"] == r["ref_names"] and r["state_dict_keys"] == r["ref_state_dict_keys"]
        assert r["params"], "no parameters compared"
        for name, p in r["params"].items():
            assert p["kind_ok"], name
            assert torch.equal(p["local"], p["want_local"]), f"{name}: wrong shard on rank {rank}"
            if p["want"] is None:  # a frozen parameter: no gradient here either
                assert p["grad"] is None, f"{name}: a gradient where the single-device run has none"
                continue
            assert p["grad_placements"] == p["placements"], f"{name}: gradient not in the parameter's placement"
            torch.testing.assert_close(p["grad"], p["want"], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name, rank=rank: f"{label} {name} rank {rank}: {m}")


def planned_collectives_issued(plan: Any, results: list[dict[str, Any]], label: str) -> Counter:
    """Assert that every rank issued exactly the plan's collective steps for job
    ``label`` (edge, kind, mesh dims, bytes), a gradient or gather bucket's one
    collective in place of its members' steps; returns the planned multiset."""
    from costmodel.redistribute_steps import COLLECTIVE_STEPS

    bucketed = {m for b in plan.buckets for m in b.members}
    gathered = {tuple(m) for g in plan.gather_buckets for m in g.members}
    planned = Counter((r.tensor, r.to, r.input_index, s.collective, tuple(s.mesh_dims), s.bytes)
                      for r in plan.redistributions for s in r.steps
                      if s.collective in COLLECTIVE_STEPS and r.to not in bucketed
                      and (r.tensor, r.to, r.input_index) not in gathered)
    recomputed = set(plan.recompute)  # a recomputed op's input redistributions run again, each on its own
    planned.update((r.tensor, r.to, r.input_index, s.collective, tuple(s.mesh_dims), s.bytes)
                   for r in plan.redistributions for s in r.steps
                   if s.collective in COLLECTIVE_STEPS and r.to in recomputed)
    planned.update(("bucket", ",".join(b.members), 0, b.collective, tuple(b.mesh_dims), b.bytes) for b in plan.buckets)
    planned.update(("gather", ",".join(f"{m[0]}>{m[1]}>{m[2]}" for m in g.members), 0, "all_gather",
                    tuple(g.mesh_dims), g.bytes) for g in plan.gather_buckets)
    for res in results:
        issued = Counter((e[0], e[1], e[2], kind, tuple(dims), nbytes)
                         for kind, dims, nbytes, _, e, *_ in res[label]["trace"])
        assert issued == planned
    return planned


def recompute_positions(traced: Any, plan: Any) -> list[tuple[int, list[str]]]:
    """Where the plan's recomputation runs, worked out here from the graph (the
    test's own reading of ``autoshard.graph.regions``): per checkpoint region
    with recomputed ops, the schedule position of the first backward op that
    reads a value of the region's forward, and the region's recomputed ops in
    plan order; regions that start their backward at one op share it."""
    import operator

    from autoshard.graph.regions import backward_nodes

    graph = traced.graph_module.graph
    region = {n.name: n.region for n in plan.nodes if n.region is not None}
    wanted = {region[name] for name in plan.recompute}
    backward = backward_nodes(graph, traced.tangent)
    position, first = 0, {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node in backward:
            for u in node.all_input_nodes:
                src = u.args[0] if u.target is operator.getitem else u
                r = region.get(src.name)
                if u not in backward and r in wanted:
                    first.setdefault(r, position)
        position += node.target is not operator.getitem
    at: dict[int, list[str]] = {}
    for name in plan.recompute:
        at.setdefault(first[region[name]], []).append(name)
    return sorted(at.items())

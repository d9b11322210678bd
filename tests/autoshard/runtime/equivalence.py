"""A sharded run against one device, step by step: the loop the runtime's multi-rank tests share.

Rank side (run inside a worker that :func:`gloo_ranks.spawn` starts):

- :func:`sgd_steps` shards a model with a plan file (``autoshard.runtime.shard``), runs a few
  SGD steps of it and of a deep copy on one device, and records per step the two losses, every
  parameter's local gradient beside the slice of the one-device gradient that its placement in
  the plan says, the collective trace, and what the test's own counter of collectives saw
  (``issued``: a list the test's wrapper appends to; cleared before each step). SGD, not Adam:
  the second step's gradients compare at the first step's tolerance (Adam amplifies last bits).
- :func:`pipeline_steps` is the same for a pipeline run (``build_pipeline``): AdamW steps of this
  rank's dp rows, the loss averaged over dp on the last stage, whole gradients against the
  one-device gradients.

Parent side: :func:`assert_steps_match_one_device` and :func:`assert_pipeline_matches_one_device`
read those records on every rank; the checks of a plan's collectives stay in the tests (a
``check_step`` callback sees each rank's step).

>>> # in the rank:  out[label] = sgd_steps(model, inputs, mesh, "plan.json", issued=issued)
>>> # in the test:  assert_steps_match_one_device(results, label, steps=2, grad_atol=1e-5)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["sgd_steps", "trace_key_of", "pipeline_steps", "assert_steps_match_one_device",
           "assert_pipeline_matches_one_device"]

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
GRAD_RTOL = 1e-4


def sgd_steps(model: torch.nn.Module, inputs: Any, mesh: Any, plan: str, *, steps: int = 2, lr: float = 0.1,
              issued: list | None = None, traces: dict[str, Any] | None = None,
              trace_key: str | None = None) -> dict[str, Any]:
    """``steps`` SGD steps of ``model`` sharded by ``plan`` (a plan file) on ``mesh`` and of its
    one-device copy; per step ``loss``, ``ref_loss``, ``grads`` (name: (this rank's gradient,
    the one-device gradient's slice in the parameter's placement)), ``issued`` (a copy of the
    caller's list after the step) and ``trace`` (the collective trace).

    ``traces``: this rank's joint graphs by ``trace_key`` (:func:`trace_key_of`: the model's
    factory and overrides), shared by the jobs of one model: the first job's ``shard`` traces
    the model as always and later ones get its graph (``shard(traced=...)``, as
    ``benchmarks/common/equivalence.py`` shares them), the trace not depending on the plan or
    the mesh. Each rank traced a tiny LLaMA for each of the 4-rank context-parallel test's five
    jobs on it, 1 s each on 2 cores shared by 4 ranks.

    >>> # out = sgd_steps(model, inputs, mesh, "/tmp/x/plan.json", steps=2, lr=0.1)
    >>> # out["steps"][1]["grads"]["layers.0.w1.weight"]  -> (local, want)
    """
    import copy

    from autoshard.runtime import local_slice, shard
    from autoshard.runtime.execute import placements_of
    from benchmarks.common.equivalence import local_of
    from benchmarks.common.models import loss_of

    mesh_shape, coord = tuple(mesh.shape), tuple(mesh.get_coordinate())
    reference = copy.deepcopy(model)
    known = traces.get(trace_key) if traces is not None and trace_key is not None else None
    sharded = shard(model, mesh, plan, inputs, trace_collectives=True, traced=known)
    if known is None and traces is not None and trace_key is not None:
        traces[trace_key] = sharded._traced
    optimizers = (torch.optim.SGD(sharded.parameters(), lr=lr), torch.optim.SGD(reference.parameters(), lr=lr))
    issued = [] if issued is None else issued
    records = []
    for _ in range(steps):
        issued.clear()
        loss = loss_of(sharded, inputs)
        loss.backward()
        ref_loss = loss_of(reference, inputs)
        ref_loss.backward()
        ref_params = dict(reference.named_parameters())
        grads = {name: (local_of(p.grad).clone(), local_slice(
            ref_params[name].grad, placements_of(sharded.plan.params[name], len(mesh_shape)), mesh_shape, coord))
            for name, p in sharded.named_parameters()}
        records.append({"loss": loss.detach().clone(), "ref_loss": ref_loss.detach().clone(), "grads": grads,
                        "issued": list(issued),
                        "trace": [(r.kind, r.mesh_dims, r.nbytes, r.group_ranks, r.edge, r.issue, r.wait)
                                  for r in sharded.collective_trace]})
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
    # "trace": the first step's, as gloo_ranks.planned_collectives_issued reads it
    experts = any(n.exchange and n.exchange[0] == "expert_dispatch" for n in sharded.plan.nodes)
    return {"steps": records, "trace": records[0]["trace"], "coord": coord,
            "graph": sharded._runner.step_graph is not None,
            "expert_imbalance": sharded.measured_expert_imbalance() if experts else None}


def trace_key_of(factory: str, overrides: Mapping[str, Any] | None) -> str:
    """The key of :func:`sgd_steps`' ``traces``: a model built by ``factory`` with ``overrides``.

    >>> trace_key_of("llama3.tiny", {"n_layers": 1})
    "('llama3.tiny', [('n_layers', 1)])"
    """
    return repr((factory, sorted((overrides or {}).items())))


def assert_steps_match_one_device(results: list[dict[str, Any]], label: str, *, steps: int,
                                  grad_atol: float = 1e-6,
                                  check_step: Callable[[int, dict[str, Any], dict[str, Any]], None] | None = None
                                  ) -> None:
    """On every rank, job ``label`` (:func:`sgd_steps`' record) ran ``steps`` steps, and on each
    the loss (rtol 1e-4, atol 1e-6) and every gradient slice (rtol 1e-4, atol ``grad_atol``)
    equal the one-device run's; ``check_step(rank, job, step)`` then checks the step's collectives.

    >>> # assert_steps_match_one_device(results, "hf.hf_llama-context_gather", steps=2, grad_atol=1e-5)
    """
    for rank, res in enumerate(results):
        job = res[label]
        assert len(job["steps"]) == steps, f"{label} rank {rank}: {len(job['steps'])} steps, not {steps}"
        for k, step in enumerate(job["steps"]):
            torch.testing.assert_close(step["loss"], step["ref_loss"], rtol=LOSS_RTOL, atol=LOSS_ATOL,
                                       msg=lambda m, k=k, rank=rank: f"{label} step {k + 1} rank {rank} loss: {m}")
            assert step["grads"], f"{label} step {k + 1} rank {rank}: no gradients compared"
            for name, (got, want) in step["grads"].items():
                torch.testing.assert_close(
                    got, want, rtol=GRAD_RTOL, atol=grad_atol,
                    msg=lambda m, name=name, k=k, rank=rank: f"{label} step {k + 1} rank {rank} {name}: {m}")
            if check_step is not None:
                check_step(rank, job, step)


def pipeline_steps(run: Any, reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor], dp: Any, *,
                   steps: int = 2, lr: float = 1e-2) -> list[dict[str, Any]]:
    """``steps`` AdamW steps of a pipeline ``run`` (``build_pipeline``) on this rank's rows of
    ``inputs`` (its share of the batch on the ``dp`` sub-mesh) and of ``reference`` on the whole
    batch; per step the loss (None off the last stage; averaged over dp), the whole gradients
    of this rank's parameters, their names, and the one-device gradients.

    >>> # steps = pipeline_steps(run, reference, inputs, mesh["dp"])
    """
    import torch.distributed as dist

    from gloo_ranks import whole

    ref_opt = torch.optim.AdamW(reference.parameters(), lr=lr)
    opt = torch.optim.AdamW(run.parameters(), lr=lr)
    share = next(iter(inputs.values())).shape[0] // dp.size()
    rows = slice(dp.get_local_rank() * share, (dp.get_local_rank() + 1) * share)
    records = []
    for _ in range(steps):
        ref_opt.zero_grad()
        output = reference(**inputs)
        ref_loss = output if isinstance(output, torch.Tensor) else output.loss  # a Hugging Face output object
        ref_loss.backward()
        opt.zero_grad()
        loss = run.step(**{k: v[rows] for k, v in inputs.items()})
        if loss is not None:
            dist.all_reduce(loss, group=dp.get_group())
            loss = loss / dp.size()
        records.append({"loss": loss, "ref_loss": ref_loss.detach(),
                        "grads": {n: whole(p.grad).clone() for n, p in run.named_parameters() if p.grad is not None},
                        "params": [n for n, _ in run.named_parameters()],
                        "ref_grads": {n: p.grad.clone() for n, p in reference.named_parameters()}})
        ref_opt.step()
        opt.step()
    return records


def assert_pipeline_matches_one_device(per_rank: list[list[dict[str, Any]]], *, holders: int, label: str = "") -> None:
    """Each rank's :func:`pipeline_steps` records: the loss where the rank has one (rtol 1e-5,
    atol 1e-6), on exactly ``holders`` ranks (the last stage's), and every one of the rank's
    parameters has a gradient equal to the one-device gradient (rtol 1e-4, atol 1e-6).

    >>> # assert_pipeline_matches_one_device([res["steps"] for res in results], holders=2)
    """
    seen = 0
    for rank, records in enumerate(per_rank):
        for step, entry in enumerate(records):
            if entry["loss"] is not None:
                seen += step == 0
                torch.testing.assert_close(entry["loss"], entry["ref_loss"], rtol=1e-5, atol=LOSS_ATOL)
            assert entry["params"], f"{label} rank {rank}: no parameters"
            assert set(entry["grads"]) == set(entry["params"]), f"{label} rank {rank}: a gradient is missing"
            for name, grad in entry["grads"].items():
                torch.testing.assert_close(grad, entry["ref_grads"][name], rtol=GRAD_RTOL, atol=1e-6,
                                           msg=lambda m, n=name, s=step: f"{label} step {s} rank {rank} {n}: {m}")
    assert seen == holders, f"{label}: the loss is on {seen} ranks, not the last stage's {holders}"

"""One spawn of 8 gloo ranks for the runtime's three tests on a 2x2x2 mesh.

``test_context_parallel_gloo8.py`` (mesh ``dp, cp, tp``), ``test_expert_parallel_gloo8.py``
(mesh ``dp, ep, tp``) and ``test_pipeline_tp_gloo.py`` (mesh ``pp, dp, tp``) each spawned their
own 8 ranks; starting 8 interpreters that import torch and transformers on the CI's two cores is
most of each test's time (about 35 s of the 48 s each took, 2026-12-05), so all three run their
jobs in one spawn: :func:`forced_plans_and_results` forces every plan in the parent (once per
session, through the ``ranks_2x2x2`` fixture of this folder's ``conftest.py``), writes it as
JSON, and :func:`run_all` runs in each rank the three tests' own workers, one after the other,
each on its own mesh. The checks stay in the tests.

>>> # plans, results = forced_plans_and_results(Path(tmp))   # what the fixture returns
>>> # results[rank]["hf_mixtral"]["steps"][0]["grads"]
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["forced_plans_and_results", "run_all"]

TIMEOUT_S = 900


def run_all(rank: int, world: int, cp_meshes: list, ep_jobs: list) -> dict[str, Any]:
    """This rank's results of the three tests' jobs, by label (they differ: a CP job is named
    ``factory-kind``, an EP job by its factory, a pipeline job ``hf`` or ``llama3``)."""
    from test_context_parallel_gloo import run_jobs
    from test_pipeline_tp_gloo import run_tp

    out = run_jobs(rank, world, cp_meshes)
    if ep_jobs:
        from test_expert_parallel_gloo8 import _rank

        out.update(_rank(rank, world, ep_jobs))
    out.update(run_tp(rank, world))
    return out


def _cp_jobs(tmp: Path, plans: dict[str, Any]) -> list[dict[str, Any]]:
    """``test_context_parallel_gloo8``'s jobs, their plans forced into ``plans`` and saved in ``tmp``."""
    from test_context_parallel_gloo import forced_plan, label_of
    from test_context_parallel_gloo8 import JOBS, MESH, NAMES

    jobs = []
    for factory, kind, overrides in JOBS:
        label = label_of(factory, kind)
        plan = plans[label] = forced_plan(factory, kind, MESH, NAMES, mesh_dim=1, overrides=overrides)
        path = tmp / f"{label}.json"
        plan.save(path)
        jobs.append({"label": label, "factory": factory, "plan": str(path), "overrides": overrides})
    return jobs


def _ep_jobs(tmp: Path, plans: dict[str, Any]) -> list[dict[str, Any]]:
    """``test_expert_parallel_gloo8``'s jobs (none without transformers), as :func:`_cp_jobs`."""
    if importlib.util.find_spec("transformers") is None:  # the EP test is skipped then
        return []
    from test_expert_parallel_gloo8 import FACTORIES, GSHARD, _forced_plan, gshard_plan, overrides_of

    jobs = []
    for factory in FACTORIES:
        plan = plans[factory] = _forced_plan(factory)
        path = tmp / f"{factory}.json"
        plan.save(path)
        jobs.append({"label": factory, "factory": f"hf.{factory}", "plan": str(path),
                     "overrides": overrides_of(factory)})
    plans["gshard"] = gshard_plan()
    plans["gshard"].save(tmp / "gshard.json")
    jobs.append({"label": "gshard", "factory": "moe.tiny", "plan": str(tmp / "gshard.json"), "overrides": GSHARD})
    return jobs


def forced_plans_and_results(tmp: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every plan of the CP and EP tests by label, and each of the 8 ranks' results of :func:`run_all`.

    >>> # plans, results = forced_plans_and_results(tmp_path_factory.mktemp("cp-ep-8"))
    """
    from gloo_ranks import spawn
    from test_context_parallel_gloo8 import MESH, NAMES

    plans: dict[str, Any] = {}
    cp_jobs, ep_jobs = _cp_jobs(tmp, plans), _ep_jobs(tmp, plans)
    results = spawn(8, run_all, ([((MESH, NAMES), cp_jobs)], ep_jobs), tmp / "ranks", timeout=TIMEOUT_S)
    return plans, results

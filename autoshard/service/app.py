"""The app of ``autoshard serve`` (FastAPI; OpenAPI at ``/openapi.json``); its routes are
APIRouters in :mod:`autoshard.service.job_routes` and :mod:`autoshard.service.ops_routes`.

Why these routes: a client submits a problem (``POST /v1/problems``: an
``autoshard.problem/1`` or IOPDDL JSON) or a dumped model problem
(``POST /v1/plans``: ``autoshard solve --dump-problem``'s file, whose
``"autoshard"`` section turns the solution into the plan that ``autoshard
solve`` would write) and gets a job id at once; it polls ``GET
/v1/jobs/{id}`` (state, progress, incumbent, bound, gap), fetches ``GET
/v1/jobs/{id}/result`` and may ``DELETE /v1/jobs/{id}``. ``/healthz`` is open;
``/metrics`` is Prometheus text. With a token, ``/v1/*`` and ``/metrics``
need ``Authorization: Bearer <token>`` (compared in constant time).

Status codes: 200 answered from the cache, 202 accepted (or attached to the
same solve in flight), 400 bad input (``{"detail", "field"}``, the solver's own
messages), 401 no or wrong token, 404 unknown job, 409 result not ready,
410 result evicted, 413 body / nodes / edges over the limit, 415 not JSON,
429 queue full (``Retry-After``).

>>> # app = create_app(ServiceConfig(cache_dir="/var/cache/autoshard")); uvicorn.run(app)
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from autoshard.service import job_routes, ops_routes
from autoshard.service.cache import ResultCache, code_version
from autoshard.service.jobs import JobManager
from autoshard.service.payload import BadRequest, Limits
from autoshard.service.app_state import Metrics, ServiceState
from autoshard.version import __version__

__all__ = ["ServiceConfig", "create_app"]


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How one server runs."""

    cache_dir: str
    """Result cache (``results/``) and bodies of jobs in flight (``spool/``)."""
    cache_bytes: int = 2**30
    """Bound on the cache's size; least recently used results go first."""
    workers: int = 2
    """Worker processes (solves at once)."""
    max_queue: int = 64
    """Jobs waiting for a worker; one more is a 429."""
    limits: Limits = field(default_factory=Limits)
    token: str | None = None
    """Bearer token required on ``/v1/*`` and ``/metrics`` (None: open)."""


def create_app(config: ServiceConfig, *, start_workers: bool = True,
               on_ready: Callable[[], None] | None = None) -> FastAPI:
    """The FastAPI app of one server: the routes of :mod:`autoshard.service.job_routes`
    and :mod:`autoshard.service.ops_routes` on one :class:`~autoshard.service.app_state.ServiceState`;
    its workers start with the app's lifespan, after which ``on_ready()`` is called.

    >>> app = create_app(ServiceConfig(cache_dir=__import__("tempfile").mkdtemp()), start_workers=False)
    >>> sorted(path for path in app.openapi()["paths"] if path.startswith("/v1"))
    ['/v1/jobs/{job_id}', '/v1/jobs/{job_id}/result', '/v1/plans', '/v1/problems']
    """
    cache = ResultCache(config.cache_dir, max_bytes=config.cache_bytes)
    metrics = Metrics()
    manager = JobManager(cache, workers=config.workers, max_queue=config.max_queue, on_finish=metrics.on_finish,
                         spool=os.path.join(config.cache_dir, "spool"))
    service = ServiceState(manager=manager, cache=cache, metrics=metrics, limits=config.limits,
                           version=code_version(), workers=config.workers,
                           token=config.token.encode() if config.token else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if start_workers:
            manager.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            if start_workers:
                manager.close()

    app = FastAPI(title="autoshard plan service", version=__version__, lifespan=lifespan,
                  description=__doc__.split("\n\n")[1])
    app.state.service = service
    app.add_exception_handler(BadRequest, _bad_request)
    app.include_router(job_routes.router)
    app.include_router(ops_routes.router)
    return app


async def _bad_request(request: Request, exc: BadRequest) -> JSONResponse:
    return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=exc.status)

"""The HTTP routes of ``autoshard serve`` (FastAPI; OpenAPI at ``/openapi.json``).

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

import hmac
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.concurrency import run_in_threadpool

from autoshard.service.cache import ResultCache, code_version, content_key
from autoshard.service.jobs import STATES, Job, JobManager, QueueFull
from autoshard.service.payload import (BadRequest, Limits, decode_body, parse_plan, parse_problem, plan_options,
                                       problem_options, release_memory)
from autoshard.version import __version__

__all__ = ["ServiceConfig", "create_app"]

RELEASE_ABOVE = 8 * 2**20
"""After checking a body this large, freed memory is handed back to the system (glibc ``malloc_trim``)."""
DRAIN_FACTOR = 4
"""A body over the limit is read (and dropped) up to this many limits, so the client hears the 413."""


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


class _Metrics:
    """The Prometheus series of one server (own registry: several servers may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("autoshard_jobs", "Jobs the server knows, by state", ["state"], registry=r)
        self.finished = Counter("autoshard_jobs_finished", "Jobs that reached a final state", ["state"], registry=r)
        self.solve_seconds = Histogram("autoshard_solve_seconds", "Wall time of finished solves (worker)",
                                       buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), registry=r)
        self.cache_hits = Counter("autoshard_cache_hits", "Requests answered from the result cache", registry=r)
        self.cache_misses = Counter("autoshard_cache_misses", "Requests that started a solve", registry=r)
        self.shared = Counter("autoshard_shared_requests", "Requests attached to an identical solve in flight",
                              registry=r)
        self.queue = Gauge("autoshard_queue_length", "Jobs waiting for a worker", registry=r)
        self.workers = Gauge("autoshard_workers_alive", "Live worker processes", registry=r)
        self.restarts = Gauge("autoshard_worker_restarts", "Worker processes replaced since the start", registry=r)
        self.cache_bytes = Gauge("autoshard_cache_bytes", "Bytes in the result cache", registry=r)
        self.cache_entries = Gauge("autoshard_cache_entries", "Results in the cache", registry=r)

    def on_finish(self, job: Job) -> None:
        self.finished.labels(job.state).inc()
        if job.state == "done" and not job.cached:
            self.solve_seconds.observe(job.seconds)


def _body_doc(text: str) -> dict[str, Any]:
    schema = {"type": "object", "description": text}
    return {"requestBody": {"required": True, "description": text + " Plain or gzip (Content-Encoding: gzip).",
                            "content": {"application/json": {"schema": schema}}}}


def create_app(config: ServiceConfig, *, start_workers: bool = True,
               on_ready: Callable[[], None] | None = None) -> FastAPI:
    """The FastAPI app of one server; its workers start with the app's lifespan,
    after which ``on_ready()`` is called.

    >>> app = create_app(ServiceConfig(cache_dir=__import__("tempfile").mkdtemp()), start_workers=False)
    >>> sorted(r.path for r in app.routes if r.path.startswith("/v1"))[:2]
    ['/v1/jobs/{job_id}', '/v1/jobs/{job_id}']
    """
    limits = config.limits
    cache = ResultCache(config.cache_dir, max_bytes=config.cache_bytes)
    metrics = _Metrics()
    manager = JobManager(cache, workers=config.workers, max_queue=config.max_queue, on_finish=metrics.on_finish,
                         spool=os.path.join(config.cache_dir, "spool"))
    version = code_version()

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
    app.state.manager, app.state.cache, app.state.metrics = manager, cache, metrics

    token = config.token.encode() if config.token else None

    def authorize(request: Request) -> None:
        if token is None:
            return
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=exc.status)

    async def read_body(request: Request) -> bytes:
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if kind not in ("application/json", "application/gzip", "application/x-gzip", ""):
            raise BadRequest(415, f"Content-Type: {kind!r}: the service takes JSON only", "Content-Type")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limits.max_body_bytes:
                chunks.append(chunk)
            elif size > DRAIN_FACTOR * limits.max_body_bytes:
                break
        if size > limits.max_body_bytes:
            raise BadRequest(413, f"(body): more than this server's limit of {limits.max_body_bytes} bytes", "(body)")
        body = b"".join(chunks)
        return await run_in_threadpool(decode_body, body, request.headers.get("content-encoding"), limits)

    async def submit(kind: str, key: str, body: bytes,
                     validate: Callable[[], tuple[dict[str, Any], int, int]]) -> JSONResponse:
        """The cache, then a solve in flight for the same key, then a new job
        (``validate()`` -> options, nodes, edges runs before it is queued)."""
        def from_cache() -> Job | None:  # reads and parses the stored result: off the event loop, in one hop
            text = cache.get(key)
            return None if text is None else manager.cached(kind, key, text)

        cached = await run_in_threadpool(from_cache)
        if cached is not None:
            metrics.cache_hits.inc()
            return JSONResponse({"id": cached.id, "state": cached.state, "cached": True, "shared": False})
        try:
            job, created = manager.open(kind, key)
        except QueueFull as exc:
            raise HTTPException(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
        if not created:
            metrics.shared.inc()
            return JSONResponse({"id": job.id, "state": job.state, "cached": False, "shared": True}, status_code=202)
        metrics.cache_misses.inc()
        path = os.path.join(manager.spool, f"{job.id}.json")

        def check_and_spool() -> tuple[dict[str, Any], int, int]:
            checked = validate()
            with open(path, "wb") as handle:
                handle.write(body)
            if len(body) > RELEASE_ABOVE:
                release_memory()  # the parsed problem is gone: give its pages back
            return checked

        try:
            options, nodes, edges = await run_in_threadpool(check_and_spool)
        except BadRequest as exc:
            manager.reject(job, str(exc))
            raise
        except BaseException:
            manager.reject(job, "the server could not read the request")
            raise
        manager.enqueue(job, path, options, nodes, edges)
        return JSONResponse({"id": job.id, "state": "queued", "cached": False, "shared": False}, status_code=202)

    option_doc = "Solver option (see the service docs)."

    @app.post("/v1/problems", status_code=202, dependencies=[Depends(authorize)], tags=["jobs"],
              openapi_extra=_body_doc("An autoshard.problem/1 or IOPDDL problem."))
    async def post_problem(
        request: Request,
        time_limit: str | None = Query(None, description="seconds (default: the server's)"),
        backend: str | None = Query(None, description="cbc (default) or cpsat"),
        method: str | None = Query(None, description="auto (default), exact, anytime, heuristic"),
        seed: str | None = Query(None, description=option_doc), threads: str | None = Query(None, description=option_doc),
        gap: str | None = Query(None, description="relative gap that counts as optimal"),
        inner: str | None = Query(None, description=option_doc),
        format: str | None = Query(None, description="autoshard or iopddl (default: detected)"),
    ) -> JSONResponse:
        """Solve a problem: returns the job id (200 with ``cached: true`` when the result is stored)."""
        options = problem_options(dict(request.query_params), limits)
        body = await read_body(request)
        key = content_key("problem", body, options, version)

        def validate() -> tuple[dict[str, Any], int, int]:
            problem = parse_problem(body, options["format"], limits)
            return options, problem.num_nodes, problem.num_edges

        return await submit("problem", key, body, validate)

    @app.post("/v1/plans", status_code=202, dependencies=[Depends(authorize)], tags=["jobs"],
              openapi_extra=_body_doc("A problem dumped by autoshard solve --dump-problem (with its autoshard "
                                      "section)."))
    async def post_plan(
        request: Request,
        time_limit: str | None = Query(None, description="seconds (default: the request's)"),
        backend: str | None = Query(None, description=option_doc), seed: str | None = Query(None, description=option_doc),
        threads: str | None = Query(None, description=option_doc), gap: str | None = Query(None, description=option_doc),
    ) -> JSONResponse:
        """Solve a model's problem and assemble its plan: returns the job id."""
        body = await read_body(request)
        # the body holds the fingerprint (graph, mesh, profile, versions) and
        # the default options, so the raw query completes the key
        key = content_key("plan", body, dict(sorted(request.query_params.items())), version)

        def validate() -> tuple[dict[str, Any], int, int]:
            problem, plan_request = parse_plan(body, limits)
            options = plan_options(dict(request.query_params), plan_request.solve, limits)
            return options, problem.num_nodes, problem.num_edges

        return await submit("plan", key, body, validate)

    @app.get("/v1/jobs/{job_id}", dependencies=[Depends(authorize)], tags=["jobs"])
    def get_job(job_id: str) -> dict[str, Any]:
        """State, progress, incumbent cost, bound and gap of a job."""
        status = manager.status(job_id)
        if status is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return status

    @app.get("/v1/jobs/{job_id}/result", dependencies=[Depends(authorize)], tags=["jobs"])
    def get_result(job_id: str) -> Response:
        """The solution (problems) or ``{"plan", "solution"}`` (plans) of a finished job."""
        job = manager.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}")
        if job.state != "done":
            detail = f"job {job_id} is {job.state}" + (f": {job.error}" if job.error else "")
            return JSONResponse({"detail": detail, "state": job.state}, status_code=409)
        text = manager.result(job)
        if text is None:
            raise HTTPException(410, f"the result of job {job_id} left the cache; submit the request again")
        return Response(text, media_type="application/json",
                        headers={"X-Autoshard-Cached": "1" if job.cached else "0"})

    @app.delete("/v1/jobs/{job_id}", dependencies=[Depends(authorize)], tags=["jobs"])
    def delete_job(job_id: str) -> dict[str, Any]:
        """Cancel a job (a running solve's worker is stopped); a finished job stays as it is."""
        if manager.cancel(job_id) is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return manager.status(job_id) or {}

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        """Liveness: workers, queue, code version (no token needed)."""
        counts = manager.counts()
        return {"status": "ok", "version": version, "workers": config.workers,
                "workers_alive": counts["workers_alive"], "queue": counts["queue"], "cache_entries": len(cache)}

    @app.get("/metrics", dependencies=[Depends(authorize)], tags=["ops"])
    def get_metrics() -> Response:
        """Prometheus text: jobs by state, solve seconds, cache hits and misses, queue length."""
        counts = manager.counts()
        for state in STATES:
            metrics.jobs.labels(state).set(counts["states"][state])
        metrics.queue.set(counts["queue"])
        metrics.workers.set(counts["workers_alive"])
        metrics.restarts.set(counts["restarts"])
        stats = cache.stats()
        metrics.cache_bytes.set(stats["bytes"])
        metrics.cache_entries.set(stats["entries"])
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app

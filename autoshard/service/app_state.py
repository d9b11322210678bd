"""What the routes of one ``autoshard serve`` share: the job manager, the result
cache, the metrics, the limits and the token, kept on ``app.state.service`` by
:func:`autoshard.service.app.create_app`; and the two dependencies every
``/v1`` route takes from it (the bearer token, the declared query options).

>>> # @router.get("/v1/x", dependencies=[Depends(authorize)]) ... service_of(request).manager
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from autoshard.service.cache import ResultCache
from autoshard.service.jobs import Job, JobManager
from autoshard.service.payload import BadRequest, Limits

__all__ = ["Metrics", "ServiceState", "service_of", "authorize", "declared_query"]


class Metrics:
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


@dataclass(frozen=True, slots=True)
class ServiceState:
    """One server's shared parts (``app.state.service``)."""

    manager: JobManager
    cache: ResultCache
    metrics: Metrics
    limits: Limits
    version: str
    """The code version in every cache key and in ``/healthz``."""
    workers: int
    token: bytes | None
    """Bearer token required on ``/v1/*`` and ``/metrics`` (None: open)."""


def service_of(request: Request) -> ServiceState:
    """The state of the server that received ``request``."""
    return request.app.state.service


def authorize(request: Request) -> None:
    """Refuse (401) a request without the server's bearer token, compared in constant time."""
    token = service_of(request).token
    if token is None:
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token):
        raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})


def declared_query(request: Request, **declared: Any) -> dict[str, str]:
    """The route's declared query options that were given (``declared``: each
    ``Query`` parameter's value); a 400 naming the first option the route does not declare.

    FastAPI drops undeclared query parameters silently; a typo (``?time_limt=5``)
    must not quietly solve with the default instead."""
    unknown = sorted(set(request.query_params) - set(declared))
    if unknown:
        raise BadRequest(400, f"{unknown[0]}: unknown option (known: {', '.join(sorted(declared))})", unknown[0])
    return {name: value for name, value in declared.items() if value is not None}

"""The operations routes of ``autoshard serve``: ``/healthz`` (liveness, open to
all) and ``/metrics`` (Prometheus text; needs the bearer token when the server
has one).

>>> sorted(route.path for route in router.routes)
['/healthz', '/metrics']
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from autoshard.service.jobs import STATES
from autoshard.service.app_state import authorize, service_of

__all__ = ["router"]

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz(request: Request) -> dict[str, Any]:
    """Liveness: workers, queue, code version (no token needed)."""
    service = service_of(request)
    counts = service.manager.counts()
    return {"status": "ok", "version": service.version, "workers": service.workers,
            "workers_alive": counts["workers_alive"], "queue": counts["queue"], "cache_entries": len(service.cache)}


@router.get("/metrics", dependencies=[Depends(authorize)])
def get_metrics(request: Request) -> Response:
    """Prometheus text: jobs by state, solve seconds, cache hits and misses, queue length."""
    service = service_of(request)
    metrics, counts = service.metrics, service.manager.counts()
    for state in STATES:
        metrics.jobs.labels(state).set(counts["states"][state])
    metrics.queue.set(counts["queue"])
    metrics.workers.set(counts["workers_alive"])
    metrics.restarts.set(counts["restarts"])
    stats = service.cache.stats()
    metrics.cache_bytes.set(stats["bytes"])
    metrics.cache_entries.set(stats["entries"])
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

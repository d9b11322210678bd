"""The job routes of ``autoshard serve``: submit a problem (``POST /v1/problems``)
or a dumped model problem (``POST /v1/plans``), poll, fetch and cancel a job
(``/v1/jobs/{id}``). Every route needs the bearer token when the server has one.

A submission is answered from the result cache, attached to the same solve in
flight, or queued as a new job once its body is checked (module
:mod:`autoshard.service.app` lists the status codes).

>>> sorted(route.path for route in router.routes)[:2]
['/v1/jobs/{job_id}', '/v1/jobs/{job_id}']
"""

from __future__ import annotations

import os
from typing import Any, Callable

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from autoshard.service.cache import content_key
from autoshard.service.jobs import Job, QueueFull
from autoshard.service.payload import (BadRequest, decode_body, parse_plan, parse_problem, plan_options,
                                       problem_options, release_memory)
from autoshard.service.app_state import ServiceState, authorize, declared_query, service_of

__all__ = ["router"]

RELEASE_ABOVE = 8 * 2**20
"""After checking a body this large, freed memory is handed back to the system (glibc ``malloc_trim``)."""
DRAIN_FACTOR = 4
"""A body over the limit is read (and dropped) up to this many limits, so the client hears the 413."""
OPTION_DOC = "Solver option (see the service docs)."

router = APIRouter(tags=["jobs"], dependencies=[Depends(authorize)])


def _body_doc(text: str) -> dict[str, Any]:
    schema = {"type": "object", "description": text}
    return {"requestBody": {"required": True, "description": text + " Plain or gzip (Content-Encoding: gzip).",
                            "content": {"application/json": {"schema": schema}}}}


async def read_body(request: Request) -> bytes:
    """The request body, decompressed; 415 for another type than JSON, 413 over the size limit."""
    limits = service_of(request).limits
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


async def submit(service: ServiceState, kind: str, key: str, body: bytes,
                 validate: Callable[[], tuple[dict[str, Any], int, int]]) -> JSONResponse:
    """The cache, then a solve in flight for the same key, then a new job
    (``validate()`` -> options, nodes, edges runs before it is queued)."""
    manager, cache, metrics = service.manager, service.cache, service.metrics

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


@router.post("/v1/problems", status_code=202, openapi_extra=_body_doc("An autoshard.problem/1 or IOPDDL problem."))
async def post_problem(
    request: Request,
    time_limit: str | None = Query(None, description="seconds (default: the server's)"),
    backend: str | None = Query(None, description="cbc (default) or cpsat"),
    method: str | None = Query(None, description="auto (default), exact, anytime, heuristic"),
    seed: str | None = Query(None, description=OPTION_DOC), threads: str | None = Query(None, description=OPTION_DOC),
    gap: str | None = Query(None, description="relative gap that counts as optimal"),
    inner: str | None = Query(None, description=OPTION_DOC),
    format: str | None = Query(None, description="autoshard or iopddl (default: detected)"),
) -> JSONResponse:
    """Solve a problem: returns the job id (200 with ``cached: true`` when the result is stored)."""
    service = service_of(request)
    query = declared_query(request, time_limit=time_limit, backend=backend, method=method, seed=seed,
                           threads=threads, gap=gap, inner=inner, format=format)
    options = problem_options(query, service.limits)
    body = await read_body(request)
    key = content_key("problem", body, options, service.version)

    def validate() -> tuple[dict[str, Any], int, int]:
        problem = parse_problem(body, options["format"], service.limits)
        return options, problem.num_nodes, problem.num_edges

    return await submit(service, "problem", key, body, validate)


@router.post("/v1/plans", status_code=202,
             openapi_extra=_body_doc("A problem dumped by autoshard solve --dump-problem (with its autoshard section)."))
async def post_plan(
    request: Request,
    time_limit: str | None = Query(None, description="seconds (default: the request's)"),
    backend: str | None = Query(None, description=OPTION_DOC), seed: str | None = Query(None, description=OPTION_DOC),
    threads: str | None = Query(None, description=OPTION_DOC), gap: str | None = Query(None, description=OPTION_DOC),
) -> JSONResponse:
    """Solve a model's problem and assemble its plan: returns the job id."""
    service = service_of(request)
    query = declared_query(request, time_limit=time_limit, backend=backend, seed=seed, threads=threads, gap=gap)
    body = await read_body(request)
    # the body holds the fingerprint (graph, mesh, profile, versions) and
    # the default options, so the query given completes the key
    key = content_key("plan", body, dict(sorted(query.items())), service.version)

    def validate() -> tuple[dict[str, Any], int, int]:
        problem, plan_request = parse_plan(body, service.limits)
        options = plan_options(query, plan_request.solve, service.limits)
        return options, problem.num_nodes, problem.num_edges

    return await submit(service, "plan", key, body, validate)


@router.get("/v1/jobs/{job_id}")
def get_job(job_id: str, request: Request) -> dict[str, Any]:
    """State, progress, incumbent cost, bound and gap of a job."""
    status = service_of(request).manager.status(job_id)
    if status is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return status


@router.get("/v1/jobs/{job_id}/result")
def get_result(job_id: str, request: Request) -> Response:
    """The solution (problems) or ``{"plan", "solution"}`` (plans) of a finished job."""
    manager = service_of(request).manager
    job = manager.get(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    if job.state != "done":
        detail = f"job {job_id} is {job.state}" + (f": {job.error}" if job.error else "")
        return JSONResponse({"detail": detail, "state": job.state}, status_code=409)
    text = manager.result(job)
    if text is None:
        raise HTTPException(410, f"the result of job {job_id} left the cache; submit the request again")
    return Response(text, media_type="application/json", headers={"X-Autoshard-Cached": "1" if job.cached else "0"})


@router.delete("/v1/jobs/{job_id}")
def delete_job(job_id: str, request: Request) -> dict[str, Any]:
    """Cancel a job (a running solve's worker is stopped); a finished job stays as it is."""
    manager = service_of(request).manager
    if manager.cancel(job_id) is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return manager.status(job_id) or {}

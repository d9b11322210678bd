"""``autoshard serve``: an HTTP plan service for a team (torch-free: it runs on a small box).

Why a service: one box with the solver and a shared result cache answers
everyone's solves. A problem solved once (same content, same solver code,
same options) is answered from the cache at once, identical requests in
flight share one solve, and every solve runs in a worker process so that a
crash or a runaway solve fails that job only.

- :mod:`autoshard.service.app`: the FastAPI app; its routes in
  :mod:`autoshard.service.job_routes` (``/v1/problems``, ``/v1/plans``,
  ``/v1/jobs/{id}``) and :mod:`autoshard.service.ops_routes` (``/healthz``,
  ``/metrics``), sharing :mod:`autoshard.service.app_state`.
- :mod:`autoshard.service.jobs`: the queue, the worker processes, progress.
- :mod:`autoshard.service.worker`: what a worker process runs.
- :mod:`autoshard.service.cache`: the content-addressed LRU disk cache.
- :mod:`autoshard.service.payload`: request bodies -> validated problems and cache keys.
- :mod:`autoshard.service.client`: the standard-library client
  (``autoshard.solve(..., server=URL)``, ``autoshard solve --server``,
  ``python -m solver FILE --server``).
- :mod:`autoshard.cli.serve`: the ``serve`` subcommand.

Importing this package imports nothing: the client needs no FastAPI.

>>> from autoshard.service.client import ServiceClient   # doctest: +SKIP
>>> ServiceClient("http://127.0.0.1:8470").health()["status"]   # doctest: +SKIP
'ok'
"""

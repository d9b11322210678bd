"""Orchestration: a model (or a problem) in, the best plan out.

- :mod:`autoshard.search.api`: :func:`~autoshard.search.api.solve`, the Python entry point.
- :mod:`autoshard.search.solve`: trace, build, solve, assemble, with options and a time limit.
- :mod:`autoshard.search.mesh_search`, :mod:`autoshard.search.mesh_layouts`,
  :mod:`autoshard.search.layout_cache`: every mesh layout of N devices, solved and compared.
- :mod:`autoshard.search.portfolio`, :mod:`autoshard.search.background`: expert baselines
  solved beside the search, in worker processes.
- :mod:`autoshard.search.baselines`, :mod:`autoshard.search.pins`: the expert baselines (DDP, FSDP, TP) as pins.
- :mod:`autoshard.search.recompute_search`, :mod:`autoshard.search.gather_objective`,
  :mod:`autoshard.search.overlap_objective`: objective terms refined between solves.
- :mod:`autoshard.search.prepared`, :mod:`autoshard.search.remote_solve`: a traced problem kept
  for several solves; solving on a plan service.
"""

"""The plan file: what crosses from the solve to the runtime, and what people read and diff.

- :mod:`autoshard.plan.format`: :class:`~autoshard.plan.format.Plan` and its parts, JSON in and out
  (``autoshard.plan/1``), and the names of the plan request's formats.
- :mod:`autoshard.plan.schema`: JSON Schemas of the plan and of the plan request.
- :mod:`autoshard.plan.fingerprint`: which graph, mesh, profile and versions a plan is for.
- :mod:`autoshard.plan.program_section`: the plan's ``program`` section, one rank's step action by action.
- :mod:`autoshard.plan.pipeline_section`: the plan's ``pipeline`` section (stages, microbatches, schedule).
- :mod:`autoshard.plan.options`: ``SolveOptions``, every choice of a solve, each default once.
- :mod:`autoshard.plan.explain`, :mod:`autoshard.plan.layout_report`: a plan and a mesh search in words.
- :mod:`autoshard.plan.cache_folder`: where plans and caches live on disk.

Importing this package imports nothing.
"""

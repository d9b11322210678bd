"""Cost model: placements, mesh spec, compute and communication time, and the
redistribution planner. Torch-free (docs/architecture.md).

Modules (import the one you need; this package imports none of them eagerly):

- ``placements``: ``R``, ``S(d)``, ``_S(d,sf=k)``, ``P(op)`` and their text form
- ``shard_shapes``: which global indices each rank holds (torch.chunk / _StridedShard)
- ``simulate``: shard / unshard / run redistribution steps on NumPy or torch arrays
- ``mesh``: ``MeshSpec`` (sizes, names, rank layout), flattenable groups, tiers
- ``compute``: roofline time of an op, local copy / fill / slice time
- ``collectives``: alpha-beta time of a collective on a (flattened) group
- ``redistribute_steps``: ``RedistributeStep`` / ``RedistributePlan`` (plan file form)
- ``redistribute``: ``plan_redistribute``, the cheapest step sequence (``redistribute_prices``: one step's price)
- ``buckets``: many collectives issued as one (gradient and gather buckets)
- ``pipeline_schedules``, ``pipeline_simulate``, ``stage_cuts``: pipeline stages: the
  schedules of ``torch.distributed.pipelining`` as per-rank action orders, their
  simulation from per-stage times, the stage cuts over repeated blocks
- ``expert_parallel``: the all-to-all exchanges of experts split over ranks
"""

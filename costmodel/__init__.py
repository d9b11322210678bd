"""Cost model: placements, mesh spec, compute and communication time, and the
redistribution planner. Torch-free (DESIGN.md).

Modules (import the one you need; this package imports none of them eagerly):

- ``placements``: ``R``, ``S(d)``, ``_S(d,sf=k)``, ``P(op)`` and their text form
- ``layout``: which global indices each rank holds (torch.chunk / _StridedShard)
- ``simulate``: shard / unshard / run redistribution steps on NumPy or torch arrays
- ``mesh``: ``MeshSpec`` (sizes, names, rank layout), flattenable groups, tiers
- ``compute``: roofline time of an op, local copy / fill / slice time
- ``collectives``: alpha-beta time of a collective on a (flattened) group
- ``steps``: ``RedistributeStep`` / ``RedistributePlan`` (plan file form)
- ``redistribute``: ``plan_redistribute``, the cheapest step sequence
"""

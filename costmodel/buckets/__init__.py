"""Buckets: many collectives of the same kind issued as one, priced as they run (torch-free).

- :mod:`costmodel.buckets.grouping`: which redistributions join a gradient or gather bucket,
  how buckets are formed (DDP's cap, FSDP2's per-block units), each member's share of a
  latency, and the copies a flat buffer adds.
- :mod:`costmodel.buckets.routes`: the route of a redistribution that may join a bucket,
  chosen at its bucketed price.

Which of a plan's edges run in buckets, and the cap chosen by the simulated step, are the
assembler's (:mod:`autoshard.assembly.buckets`).
"""

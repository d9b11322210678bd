"""One rank's training step as a program: the schedule of its collectives, the lifetime of its values.

Built once from the assembled graph and the solver's choice; the planner
prices it (time: ``costmodel.overlap``; memory: :mod:`autoshard.program.memory`;
the caching allocator's replay: :mod:`autoshard.program.reservation`), the
plan file records it (``plan.schedule``) and the runtime interprets it
(``autoshard.runtime.execute``). Torch-free.

- :mod:`autoshard.program.actions`: the step as typed actions (compute, issue, wait, a bucket's
  pack and unpack, recompute, free) with every value's lifetime, built once; the runtime interprets it.
- :mod:`autoshard.program.live_bytes`: the bytes a rank holds, replayed from its program (what the runtime
  measures).
- :mod:`autoshard.program.schedule`: where each collective is issued and waited.
- :mod:`autoshard.program.memory`: the exact memory timeline of the chosen placements.
- :mod:`autoshard.program.shared_copies`: one redistributed copy for several readers.
- :mod:`autoshard.program.reservation`: what PyTorch's caching allocator reserves for it.
"""

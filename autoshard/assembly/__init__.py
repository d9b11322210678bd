"""Solution -> plan: the solver's choice per node turned into a :class:`~autoshard.plan.format.Plan`.

- :mod:`autoshard.assembly.request`: what the assembler reads (the assembly graph, the plan request JSON).
- :mod:`autoshard.assembly.assemble`: the torch-free assembler (shared with the plan service):
  placements, redistributions, buckets, schedule, estimate.
- :mod:`autoshard.assembly.from_graph`: what the assembler needs from a traced model's strategy graph.
- :mod:`autoshard.assembly.buckets`: which edges run in buckets, their latency share and routes,
  and the gradient bucket cap chosen by the simulated step.
- :mod:`autoshard.assembly.step_program`: the plan's step program, built from the graph and the choice
  (what the planner prices and the runtime runs).
- :mod:`autoshard.assembly.tidy_states`: recomputation states that change nothing, set back to keep.
- :mod:`autoshard.assembly.graph_memo`: per-graph values computed once.
- :mod:`autoshard.assembly.engine_pricing`: a solved plan repriced with engine features autoshard's runtime
  does not run (torchao float8 linears, async TP), for predicting published runs.
- :mod:`autoshard.assembly.param_comm`: a solved plan's parameter communication apart from what a
  microbatch repeats (a pipeline stage gathers its weights and reduces its gradients once a step).
"""

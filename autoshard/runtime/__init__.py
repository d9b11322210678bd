"""Runtime: run a plan on a real mesh (docs/architecture.md, "Runtime").

* :mod:`autoshard.runtime.module`: :class:`ShardedModule` / :func:`shard`, the
  user API (DTensor parameters, ``forward`` -> loss, ``backward`` -> ``.grad``);
* :mod:`autoshard.runtime.execute`: :class:`JointRunner`, the joint graph on
  one rank's local shards with the plan's redistributions;
* :mod:`autoshard.runtime.steps`: one redistribution step on a local tensor;
* :mod:`autoshard.runtime.collectives`: functional collectives on mesh-dim and
  flattened process groups, and the collective trace
  (``AUTOSHARD_TRACE_COLLECTIVES=1``);
* :mod:`autoshard.runtime.process_group`: starting and ending a job's process
  groups so that none outlives it (``destroy_process_groups``).
"""

from autoshard.runtime.collectives import TRACE_ENV, CollectiveRecord, MeshComm
from autoshard.runtime.execute import JointRunner, RuntimeLoadError
from autoshard.runtime.module import ShardedModule, shard, to_dtensor_placements
from autoshard.runtime.process_group import destroy_process_groups, init_process_group
from autoshard.runtime.shards import local_slice

__all__ = ["TRACE_ENV", "CollectiveRecord", "MeshComm", "JointRunner", "RuntimeLoadError", "local_slice",
           "ShardedModule", "shard", "to_dtensor_placements", "destroy_process_groups", "init_process_group"]

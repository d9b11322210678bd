"""Put this folder's helpers (``threadcomm``, ``gloo_ranks``, ``equivalence``) on ``sys.path``:
spawned rank processes inherit it and import the worker functions by name; and the 8-rank
context-parallel, expert-parallel and pipeline-TP tests' shared spawn (``ranks_2x2x2``); the fake
2-rank process group the CUDA fake-tensor tests run their exchanges on (``fake_world``)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def ranks_2x2x2(tmp_path_factory):
    """(plans by label, every rank's results) of the one spawn that the 8-rank context-parallel,
    expert-parallel and pipeline-TP tests share (``ranks_2x2x2.py``: starting 8 ranks is most
    of each test's time)."""
    from ranks_2x2x2 import forced_plans_and_results

    return forced_plans_and_results(tmp_path_factory.mktemp("cp-ep-8"))


@pytest.fixture(scope="module")
def fake_world():
    """A process group of 2 ranks whose collectives move nothing (``fake`` backend), as rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()

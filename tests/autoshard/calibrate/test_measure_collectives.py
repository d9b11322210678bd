"""The timed call of a collective waits for its result.

``MeshComm`` only issues a collective (the runtime waits where the plan's
schedule says); a calibration that timed the issue alone measured nothing of
the transfer and left every result in flight until a full run ran out of
memory. These checks use a recording stand-in for ``MeshComm`` so that they
run without a process group.
"""

from __future__ import annotations

import pytest

from autoshard.calibrate.measure_collectives import COLLECTIVE_KINDS, Groups
from autoshard.calibrate.timing import Job
from costmodel.mesh import MeshSpec


class RecordingComm:
    """Issues return a token; ``wait`` must be handed that token."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def _issue(self, kind: str) -> object:
        token = object()
        self.events.append((f"issue {kind}", token))
        return token

    def all_gather(self, x, dims, nbytes):
        return self._issue("all_gather")

    def all_reduce(self, x, op, dims, nbytes):
        return self._issue("all_reduce")

    def reduce_scatter(self, x, op, dims, nbytes):
        return self._issue("reduce_scatter")

    def all_to_all(self, x, dims, nbytes):
        return self._issue("all_to_all")

    def permute(self, x, shift, dims, nbytes):
        return self._issue("permute")

    def wait(self, token):
        self.events.append(("wait", token))
        return token


def _groups(comm: RecordingComm) -> Groups:
    groups = object.__new__(Groups)  # no process group: only what ``call`` reads
    groups.job = Job.single()
    groups.spec = MeshSpec((2, 2), ("x", "y"))
    groups.comm = comm
    return groups


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_each_timed_collective_call_waits_for_what_it_issued(kind):
    comm = RecordingComm()
    fn = _groups(comm).call(kind, (0, 1), 4096)
    for _ in range(3):
        fn()
    assert [name for name, _ in comm.events] == [f"issue {kind}", "wait"] * 3
    issued = [token for name, token in comm.events if name != "wait"]
    waited = [token for name, token in comm.events if name == "wait"]
    assert all(a is b for a, b in zip(issued, waited))

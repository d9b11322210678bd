"""A declared host sync: the audit counts the declaration and takes one read inside it as declared.

On CUDA fake tensors (a CPU-only torch), ``t.cpu()`` is the device-to-host copy ``.tolist()``
makes on a GPU. Inside ``declared_host_sync`` the first such read is the declared one; a second
read inside, or any read outside, stays a finding; with no audit active a declaration does nothing.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.runtime.device_audit import DeviceAudit, declared_host_sync

CUDA = torch.device("cuda", 0)


def test_a_declaration_takes_one_read_and_leaves_the_others_as_findings() -> None:
    with FakeTensorMode():
        x = torch.empty(4, device=CUDA)
        with DeviceAudit(CUDA) as audit:
            with declared_host_sync("split sizes"):
                x.cpu()
            with declared_host_sync("twice"):
                x.cpu()
                x.cpu()
            x.cpu()
            with declared_host_sync("nothing read"):
                pass
    assert audit.declared_syncs == ["split sizes", "twice", "nothing read"]
    assert audit.host_syncs == ["aten._to_copy.default to the CPU"] * 2


def test_a_declaration_outside_an_audit_is_recorded_nowhere() -> None:
    with DeviceAudit(CUDA) as audit:
        pass
    with declared_host_sync("after the audit"):
        pass
    assert audit.declared_syncs == [] and audit.problems == []

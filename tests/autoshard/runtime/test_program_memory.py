"""The runtime's measured live bytes against its step program's own prediction.

``JointRunner.last_step_peak_bytes`` (``autoshard.runtime.live_bytes``) counts the
storages the interpreter really holds while it runs the step program; the program's
replay (``autoshard.program.live_bytes.live_bytes_timeline``) predicts it from the actions
alone, with each value's storages from the plan's placements and the ops' alias
annotations (``program_storages``). On a mesh of one rank no value is redistributed,
so the replay counts everything the runner counts and the two must be equal to the
byte: a value the runner frees later (or earlier) than the program says, a
recomputation phase that runs elsewhere, or a view counted as a copy, each shows.
With redistributions the replay holds each redistributed copy where the runner does
(``program_copies``: from its wait or its reader to its last reader, a bucket's to the end),
so on two ranks (DDP: a redistributed loss and a gradient bucket, on an MLP and on a
llama with selective recomputation; FSDP: gather buckets and reduce-scatter buckets, whose
members exist from their bucket's ``Unpack``, with and without full recomputation) the two
are equal too.
"""

from __future__ import annotations

import pytest
import torch
from threadcomm import run_threads

from autoshard.program.actions import Recompute, Unpack
from autoshard.program.live_bytes import live_bytes_timeline
from autoshard.runtime.execute import JointRunner, local_slice, placements_of
from autoshard.runtime.live_bytes import program_copies, program_storages
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3, mlp

PROFILE = "cpu-gloo"


def _measured_and_predicted(model, inputs, mesh, recompute, baseline="ddp"):
    prep = prepare(model, inputs, mesh, ("dp",), profile=PROFILE)
    plan = solve_prepared(prep, baseline=baseline, recompute=recompute, time_limit=10)
    traced, n = prep.traced, len(mesh)

    def rank(coord, comm):
        params = {k: local_slice(p.detach(), placements_of(plan.params[k], n), mesh, coord)
                  for k, p in model.named_parameters()}
        buffers = {k: local_slice(b, placements_of(plan.buffers[k], n), mesh, coord)
                   for k, b in model.named_buffers() if k in plan.buffers}
        ins = [local_slice(x, placements_of(plan.inputs[k], n), mesh, coord) for k, x in zip(traced.inputs, inputs)]
        runner = JointRunner(traced, plan, mesh, coord, comm=comm, graph=False)
        runner.run(params, buffers, ins)
        leaves = {node: params[fqn] for fqn, node in traced.params.items()}
        leaves.update({node: buffers[fqn] for fqn, node in traced.buffers.items()})
        leaves.update(dict(zip(traced.inputs.values(), ins)))
        leaves[traced.tangent] = torch.ones(())
        copies, remade = program_copies(runner.binding)
        _, peak = live_bytes_timeline(runner.program, program_storages(runner.binding, leaves),
                                      [runner.binding.value_name(node) for node in leaves], copies=copies,
                                      remade=remade)
        return runner.last_step_peak_bytes, peak, runner.program, len(plan.redistributions), plan

    return run_threads(mesh, rank)


@pytest.mark.parametrize("name, recompute", [("mlp", "none"), ("mlp", "full"), ("llama", "selective")])
def test_one_rank_holds_exactly_the_bytes_its_program_predicts(name, recompute):
    model, inputs = mlp.tiny(n_layers=3) if name == "mlp" else llama3.tiny(batch_size=2, seq_len=16)
    ((measured, predicted, program, redistributions, _),) = _measured_and_predicted(model, inputs, (1,),
                                                                                    recompute).values()
    assert redistributions == 0
    assert (recompute == "none") == (not any(isinstance(a, Recompute) for a in program.actions))
    assert measured == predicted


@pytest.mark.parametrize("name, recompute", [("mlp", "none"), ("llama", "selective")])
def test_with_redistributions_two_ranks_hold_exactly_the_bytes_their_program_predicts(name, recompute):
    model, inputs = mlp.tiny(n_layers=3) if name == "mlp" else llama3.tiny(batch_size=2, seq_len=16)
    results = _measured_and_predicted(model, inputs, (2,), recompute)
    for measured, predicted, _, redistributions, _ in results.values():
        assert redistributions > 0
        assert measured == predicted


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_with_gather_and_gradient_buckets_two_ranks_hold_exactly_the_bytes_their_program_predicts(recompute):
    model, inputs = mlp.tiny(n_layers=3)
    results = _measured_and_predicted(model, inputs, (2,), recompute, baseline="fsdp")
    for measured, predicted, program, _, plan in results.values():
        assert plan.gather_buckets and plan.buckets, "FSDP on an MLP of three layers gathers and reduces in buckets"
        assert any(isinstance(a, Unpack) and a.item.gather is not None for a in program.actions)
        assert measured == predicted

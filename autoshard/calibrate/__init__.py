"""Measure a machine into an ``autoshard.hw_profile/1`` and check how well
the cost model, priced with it, predicts what it never saw.

Why: the solver picks a plan by the cost model's prices; datasheet profiles
guess efficiency curves, launch cost and collective latency, and the old
``cpu-gloo`` profile priced every working set at one DRAM rate (elementwise
ops on small tensors 1.4-5.4x too slow). ``autoshard calibrate-hardware``
measures the figures on the job's own ranks and groups and fits them through
the cost model's own formulas.

Stages (one module each): ``timing`` (the protocol: warm-up, repeats,
barrier, max over ranks, outliers, median), ``measure_compute`` (launch,
GEMMs, memory bandwidth over working sets, attention),
``measure_collectives`` (every kind on every mesh-dim and flattened group),
``fit`` (curves; alpha-beta per tier through ``costmodel.collectives``),
``output`` (assemble, validate, write atomically), ``heldout`` + ``report``
(the accuracy check), ``runner`` (one rank's run), ``rank`` (a rank's
entry: one-line failures; ``python -m autoshard.calibrate.rank`` in each
process ``--nproc-per-node`` starts) and ``launch`` (``--nproc-per-node``).
The command's flags are :mod:`autoshard.cli.calibrate_hardware`.

Commands (from the repository root)::

    # CPU, 4 gloo ranks on this host (ranks share the cores: compute is
    # measured on all ranks at once, so the device is "one rank of 4"):
    torchrun --standalone --nproc-per-node 4 -m autoshard.cli calibrate-hardware \\
        -o hw_profiles/data/cpu-gloo.json \\
        --report benchmarks/calibration_report.md --plot benchmarks/calibration_check.png
    # the same without torchrun (one-line messages on Ctrl-C or a failed rank):
    autoshard calibrate-hardware --nproc-per-node 4 -o my-cpu.json --quick
    # accuracy report of an existing profile (held-out ops and collectives):
    autoshard calibrate-hardware --nproc-per-node 4 --check my-cpu.json --plot check.png

    # GPU node, NCCL, 8 GPUs, mesh 2x4 (UNTESTED on GPU: written for CUDA
    # events, torch.cuda.synchronize and NCCL, but never run on one):
    torchrun --standalone --nproc-per-node 8 -m autoshard.cli calibrate-hardware \\
        --backend nccl --base h100-sxm-80gb --mesh 2x4 --dims dp,tp -o my-h100.json \\
        --report my-h100-report.md
    # several nodes: torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...
    # (the intra-node tier has LOCAL_WORLD_SIZE ranks, the network tier the rest)

Python API (every rank of a job, or one process)::

    >>> from autoshard.calibrate.timing import Job, Settings, measure
    >>> t = measure(Job.single(), lambda: None, Settings(warmup=0, trials=1, min_trial_s=0))
    >>> t.seconds >= 0
    True
"""

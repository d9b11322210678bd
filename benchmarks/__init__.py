"""The scripts behind every number in ``benchmarks/RESULTS.md``, and their small library.

How they run: from the repository root, as modules of this package,

    python -m benchmarks.runtime_step --models mlp --meshes 4 --steps 5 --no-compile

or as files, ``python benchmarks/runtime_step.py ...`` (the form older pages
cite), which re-executes itself as the module (``benchmarks/_as_module.py``).
Either way the repository root is ``sys.path[0]`` (``python -m`` puts the
current folder there), so ``benchmarks.*`` and the ``examples.models.*``
factories import by their names and no script edits ``sys.path``; the
installed packages (``autoshard``, ``solver``, ``costmodel``, ``hw_profiles``)
come from the editable install. The tests import the scripts the same way
(pytest's ``pythonpath = ["."]``).

The library, ``benchmarks/common/``: ``models`` (every ``MODULE:FACTORY``
through :func:`autoshard.trace.model_spec.load_model`), ``gloo`` (the one
launcher of gloo ranks), ``timing`` (the one train-step timer) and
``equivalence`` (a sharded step against one device, rank by rank: the
runtime's tests and ``gpu_check.py`` part b).
"""

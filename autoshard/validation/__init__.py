"""Numerical validation of the sharding rules: every strategy a rule offers is
run on simulated shards (no process group) and compared with the unsharded op.

Why a package apart from :mod:`autoshard.rules`: the rules are what the solver
uses at solve time; their validation is a test bench that runs them (it imports
torch's OpInfo database, draws random tensors, compares within error bounds).
A rule carries only what the bench needs from it (its ``samples`` generator,
:mod:`autoshard.rules.samples`, and its ``error_bound``,
:mod:`autoshard.rules.error_bounds`); no rules module imports this package.
A rule derived from DTensor at solve time (:mod:`autoshard.rules.dtensor_fallback`)
is checked before it is adopted by the check its caller hands down,
:func:`autoshard.validation.validator.check_derived_rule`.

Modules, from the core outwards:

- :mod:`autoshard.validation.compare`: shards and comparisons (random partial
  pieces, per-dtype tolerances, infinities and NaN).
- :mod:`autoshard.validation.validator`: each rule on its own random samples and their
  dtype and extreme-value variants, on meshes 2, 3, 2x2, strided and uneven.
- :mod:`autoshard.validation.real_calls`: the distinct calls of a traced model, on
  their real shapes.
- :mod:`autoshard.validation.opinfo` and :mod:`autoshard.validation.opinfo_sweep`:
  the ATen calls of PyTorch's OpInfo samples, every CPU dtype.
- :mod:`autoshard.validation.coverage`: which of a traced model's ops have a rule at all
  (``autoshard coverage``); here, not in the rules, because it reads a traced graph and the
  rules sit below the trace.

The command is ``autoshard validate-rules`` (:mod:`autoshard.cli.validate_rules`).
Importing this package imports nothing.

>>> from autoshard.validation.validator import validate_rule   # doctest: +SKIP
"""

"""Example models: each module exposes factories ``FACTORY(**overrides) -> (model, example_inputs)``."""

"""Example models: each module exposes factories ``FACTORY(**overrides) -> (model, example_inputs)``.

``mlp``, ``gpt2``, ``llama3``, ``moe``, ``convnet``, ``vit`` are written here and
return the loss from ``model(*example_inputs)``; ``hf`` builds Hugging Face
``transformers`` models as users have them (``model(**example_inputs).loss``,
needs the ``dev`` extra); ``titan`` builds torchtitan's LLaMA-3 with
torchtitan's loss (needs the ``zoo`` extra).
"""

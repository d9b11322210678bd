"""autoshard: automatic sharding of PyTorch models over N-D device meshes.

The pipeline (DESIGN.md): trace -> op rules -> strategy graph -> solve -> plan
-> runtime. This package holds the torch-facing stages; the torch-free layers
below it are ``solver``, ``costmodel`` and ``hw_profiles``.
"""

__version__ = "0.1.0"

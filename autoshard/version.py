"""The package's version, in a module of its own: plan fingerprints and the
service's cache keys read it without importing ``autoshard`` (whose lazy
``__getattr__`` names the whole pipeline)."""

__version__ = "0.1.0"

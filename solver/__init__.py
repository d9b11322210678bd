"""Strategy-graph solver (torch-free)."""

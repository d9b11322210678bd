"""Example models and scripts for autoshard (not part of the installed package)."""

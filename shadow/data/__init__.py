"""Data shipped with shadow (read with importlib.resources)."""

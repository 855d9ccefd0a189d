"""The cost to a decoding main model (``python -m benchmarks.ab_cost``, see ``run.py``) and its parts."""

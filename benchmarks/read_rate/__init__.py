"""The read-rate benchmark (``python -m benchmarks.read_rate``, see ``run.py``) and its parts."""

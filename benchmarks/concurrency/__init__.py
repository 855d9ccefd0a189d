"""Many agents at once on a simulated clock (``python -m benchmarks.concurrency``, see ``run.py``) and its parts."""

"""The freshness replay (``python -m benchmarks.freshness``, see ``run.py`` and README.md) and its parts."""

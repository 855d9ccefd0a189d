"""The soak: a real ``shadow serve`` fed for a set time (``python -m benchmarks.soak``, ``run.py``) and its parts."""

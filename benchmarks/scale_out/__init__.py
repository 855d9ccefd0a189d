"""A fleet of shadows that loses an instance now and then (``python -m benchmarks.scale_out``, see
``run.py``): the replay's members, the fleet, the store's measurement (``store.py``)."""

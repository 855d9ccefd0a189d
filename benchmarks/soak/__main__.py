"""``python -m benchmarks.soak``: runs ``run.main``."""

from benchmarks.soak.run import main

main()

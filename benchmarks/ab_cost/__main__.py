"""``python -m benchmarks.ab_cost``: runs ``run.main``."""

from benchmarks.ab_cost.run import main

raise SystemExit(main())

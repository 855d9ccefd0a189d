"""``python -m benchmarks.freshness``: runs ``run.main``."""

from benchmarks.freshness.run import main

raise SystemExit(main())

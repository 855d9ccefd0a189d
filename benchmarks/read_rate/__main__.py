"""``python -m benchmarks.read_rate``: runs ``run.main``."""

from benchmarks.read_rate.run import main

raise SystemExit(main())

"""``python -m benchmarks.concurrency``: runs ``run.main``."""

from benchmarks.concurrency.run import main

raise SystemExit(main())

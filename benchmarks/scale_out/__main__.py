"""``python -m benchmarks.scale_out``: runs ``run.main``."""

from benchmarks.scale_out.run import main

raise SystemExit(main())

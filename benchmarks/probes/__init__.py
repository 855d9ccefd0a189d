"""One-off probes: each measured one question once; its figure is in ``results/`` and ``../README.md``.

Run one as ``python -m benchmarks.probes.<name> --out DIR`` (see its docstring); most need CUDA."""

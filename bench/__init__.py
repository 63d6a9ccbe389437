"""bonkernels benchmarks: ``python -m bench`` (see bench/run.py and bench/README.md)."""

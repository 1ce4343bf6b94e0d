"""Benchmarks (each ``bench_*.py`` a script) and the load driver they share (``chat_load``)."""

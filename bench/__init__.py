"""Benchmarks, each beside its baseline in one run: ``python -m bench [area …]`` (``make bench``)."""

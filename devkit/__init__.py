"""Developer tooling shared by the tests, the demo and the benchmarks (not deployed)."""

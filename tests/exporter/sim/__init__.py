"""Tests of the fleet simulator (exporter/sim)."""

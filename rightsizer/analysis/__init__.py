"""Prometheus history to per-device usage and the plain data handed to the optimiser."""

"""Snapshot → metric families → exposition bytes: pure functions shared by the live exporter and the backfill."""

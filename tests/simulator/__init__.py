"""Tests of the fleet simulator (simulator/)."""

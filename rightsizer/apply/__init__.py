"""Applying a plan through the MIG Manager's label protocol: configs, node protocol, dry run."""

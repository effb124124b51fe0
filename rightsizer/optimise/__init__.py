"""Pure optimisation: demand items, packing, per-node and pooled proposals."""

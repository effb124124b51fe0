"""Code shared by the three services, which may not import each other: pure helpers, no I/O."""

"""One module per subcommand; each defines ``add_arguments(parser)`` and ``run(args) -> int``."""

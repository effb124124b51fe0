"""Reference pages generated from the code: one page per command from its argparse parser
(:mod:`devkit.clidocs.commands`) and the Helm chart's values table from its JSON schema
(:mod:`devkit.clidocs.helmvalues`). ``python -m devkit.clidocs`` writes them under docs/reference/;
``--check`` says which checked-in page is stale instead (the tests run it)."""

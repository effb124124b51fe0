"""The exporter's command line: flags and dcgm-exporter's flags and environment → settings → the running parts."""

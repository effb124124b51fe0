"""The metric contract: DCGM fields and names, dcgm-exporter's counters file, the series layout, the Xid catalogue."""

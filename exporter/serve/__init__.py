"""The exporter's HTTP(S) endpoint and its web configuration (TLS, basic auth)."""

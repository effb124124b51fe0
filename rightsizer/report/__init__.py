"""The weekly report: data from Prometheus, charts, HTML and Markdown."""

"""The serve suite (issue: serving decode under load). So far only its figures (metrics.py) exist: the server
start, the load generator, the asv adapter and the CLI are not written yet."""

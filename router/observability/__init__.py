"""Seeing what the router does: the access log, log formats, the status page and its data."""

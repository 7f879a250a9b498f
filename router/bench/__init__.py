"""Benchmarks: the speculative readiness scorecard and the proxy overhead measurement."""

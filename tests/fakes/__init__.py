"""Loopback fake upstreams and a spawnable fake worker for the tests."""

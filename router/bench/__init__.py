"""Benchmarks: one subpackage per benchmark (``scorecard``, ``overhead``, ``agent``, ``lanes``,
``sources``), each a pipeline of stages (``plan`` -> ``run`` -> ``score`` -> ``report``), and
the pieces they share in ``common``; their command lines are in ``router/cli/bench.py``."""

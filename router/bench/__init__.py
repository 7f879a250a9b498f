"""Benchmarks: one subpackage per benchmark (``scorecard``, ``overhead``, ``agent``,
``sources``), each a pipeline of stages (``plan`` -> ``run`` -> ``score`` -> ``report``), and
the pieces they share in ``common``."""

"""The draft-source benchmark (run by ``examples/spec_families.py``): ``plan`` (variants and
request bodies) -> ``report`` (settled, summaries, tables, goals)."""

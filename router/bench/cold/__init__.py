"""``speclane bench cold``: a cold request's time to first token, load included, through
speclane and through a fresh ``mlx_lm.server`` on the same model, rounds interleaved (issue
29). ``plan`` -> ``run`` -> ``report``; what each figure measures: docs/benchmarks.md."""

"""``speclane bench distributed``: one copy-heavy stream on a group of ranks, speclane's
speculative lane against ``mlx_lm.server`` started the same way with ``mlx.launch``."""

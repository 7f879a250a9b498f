"""``speclane bench agent``: ``plan`` (the conversation) -> ``run`` (speclane's batching lane and
``mlx_lm.server`` in turn) -> ``report`` (ratios against the goals) -> ``cli``."""

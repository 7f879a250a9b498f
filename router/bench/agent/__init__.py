"""``speclane bench agent``: ``run`` (speclane's batching lane and ``mlx_lm.server`` in turn,
on ``common.workload``'s conversation) -> ``report`` (ratios against the goals)."""

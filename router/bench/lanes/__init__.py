"""``speclane bench lanes``: the shared and separate lane layouts against ``mlx_lm.server
--draft-model`` on the same model and draft, through the same phases: memory after the same
warm-up, a mixed load, agent conversations that alternate lanes or stay on one. ``run`` ->
``report`` (the ratios against the goals)."""

"""``speclane bench lanes``: the shared and separate lane layouts against ``mlx_lm.server
--draft-model`` on the same model and draft, target after target through the same phases:
memory after the same warm-up, a mixed load (an interactive stream beside batched ones), and
agent conversations that alternate lanes or stay on one. ``run`` -> ``report``: ratios of
one run against the goals (shared memory <= 1.1x ``mlx_lm.server``'s, alternating turns'
TTFT <= 1.1x staying on one lane, shared aggregate tok/s >= 0.85x separate's)."""

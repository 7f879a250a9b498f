"""The generation engines and what they share: ``engine`` (one generation thread fed by a
queue, ``jobs``), the speculative lane (``speculative``), the batching lane (``batching``,
its verify step in mlx-lm's batch generator: ``batchverify``), both on one thread in the
shared layout (``shared``), the prompt cache (``promptcache``) and the usage figures
(``stats``)."""

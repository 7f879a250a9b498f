"""``speclane bench lanes``: the two lane layouts against ``mlx_lm.server --draft-model``, in
one run, on the same model and draft directories (issue 25).

The targets (``--targets`` picks some): ``shared`` (the router's default ``shared_threads``:
``router.worker.shared.threads_for``), ``shared-1thread`` (one thread
taking turns between the lanes), ``separate`` and ``mlx_lm.server``. Each target runs alone,
one after the other, through the same phases:

- memory: the proportional set size (PSS) of its model-holding processes after the same
  warm-up (one short chat on each lane): speclane's workers as ``/admin/lanes`` reports them,
  ``mlx_lm.server``'s own process;
- mixed load: an interactive stream on the speculative lane while the batching lane serves
  ``--concurrency`` streams (end-of-text banned, so each runs its full length): the
  interactive stream's TTFT and decode tok/s, and the aggregate tok/s of the others;
- an agent conversation whose turns alternate between the lanes, and one that stays on the
  speculative lane: turn 2+ TTFT of each (a layout that keeps the cache across lanes keeps
  them close).

``mlx_lm.server`` has no lanes: every request goes to its one endpoint (with a draft model it
does not batch). The numbers are printed and written as JSON; nothing here asserts them. The
goals (ratios of one run): shared memory <= 1.1x ``mlx_lm.server``; in shared, alternating
turns' TTFT within 1.1x of staying on one lane; shared aggregate tok/s >= 0.85x separate.
"""

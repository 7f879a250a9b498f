"""A lane over a group of ranks on MLX's distributed runtime (``mx.distributed``).

Rank 0 (the leader) is an ordinary speculative lane worker: it answers HTTP, owns the prompt
cache's decisions, the draft sources and a draft model, and samples. Every forward pass of
the target, and every cache operation it depends on, is sent to the other ranks (the
followers) as one small message of a fixed-size op log (``protocol``) before rank 0 runs it,
so that all ranks run the same pass on their own shard of the model at the same time
(``leader``, ``follower``). The messages travel by ``mx.distributed.all_sum`` (``channel``),
as ``mlx_lm.server`` hands its requests to its other ranks.
"""

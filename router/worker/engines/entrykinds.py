"""The kinds of a prompt-cache entry, what both tiers store: memory (``promptcache``) and
disk (``diskcache``, which ``promptcache`` reads through)."""

# In mlx-lm's eviction order (LRUPromptCache.CacheOrder): whole sequences go first.
SEQUENCE = "assistant"
USER = "user"  # a user turn's end
SYSTEM = "system"  # the system prompt and tools
SEGMENT_KINDS = (SYSTEM, USER)

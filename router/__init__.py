"""speclane: an OpenAI-compatible router with a speculative and a batching MLX lane."""

__version__ = "0.1.0"

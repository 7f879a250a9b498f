"""The MLX lane worker process: one model (plus a draft), served over an OpenAI-compatible API."""

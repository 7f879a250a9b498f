"""The two MLX lanes: supervision, process states, gating, the default model."""

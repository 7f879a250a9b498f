"""``speclane bench prefill``: what an agent's turns prefill, speclane's lanes against
``mlx_lm.server``: a long system prompt, a conversation's next turn, a new conversation of
the same client, a restart of the server in the middle, then the next turn and another new
conversation. Per request: prompt tokens, cached tokens (as each server reports them), the
tokens prefilled, the ideal (what was new), the time to the first token."""

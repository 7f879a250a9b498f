"""``speclane bench session``: agents' editing sessions, turn by turn, against
``mlx_lm.server`` (with and without its draft model) and speclane."""

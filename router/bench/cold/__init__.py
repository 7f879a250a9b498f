"""``speclane bench cold``: time to first token of a cold request, load included, through
speclane and through ``mlx_lm.server`` started fresh on the same model, side by side in one
run, several rounds interleaved (issue 29).

Each round starts both sides afresh (their order alternates from round to round):

- ``mlx_lm.server``: from the process's start to the first token of its first request (sent
  as soon as its port accepts it: the model loads meanwhile). That is its cold start.
- speclane, ``on-demand`` mode (``[lanes] models_dir``): a temporary models folder holds the
  same model twice under two names; the first is loaded at start-up, the second is not. The
  cold figure is the time to first token of the first request for the second one (its load
  included). The start-up to first token on the first model is recorded too.
- speclane, ``startup`` mode (a router without ``models_dir``): from ``speclane serve``'s
  start to the first token of its first request on the model.

Then a few warm requests on each side (distinct prompts, so no prompt cache answers them):
their TTFT side by side, and the router's own overhead (``X-Speclane-Overhead-Ms``).

Neither side runs a draft model: the load compared is the same weights. The numbers are
printed and saved (JSON and Markdown, with the date, commit and load average); nothing here
asserts them.
"""

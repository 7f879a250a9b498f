"""``speclane bench``: the speculative readiness scorecard. ``plan`` (the matrix and its time
budget) -> ``run`` (stream every request through the router) -> ``records`` and ``score``
(figures, gates, verdict) -> ``report`` (JSON, Markdown, ``plot``'s charts)."""

"""Backends: the seam between the router and whatever serves a model.

A ``Backend`` is one OpenAI-compatible server, external (configured in ``[[backends]]``)
or one of speclane's own MLX lanes (registered by the supervisor). The relay only ever
talks to a backend through its ``base_url``, ``auth_headers()`` and timeouts; everything
a decision needs is read from ``Backend.view()`` snapshots.
"""

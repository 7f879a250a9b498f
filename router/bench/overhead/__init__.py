"""``speclane bench overhead``: ``run`` (the upstream, the proxies, the load generator) ->
``report`` (what each proxy adds over direct, against the targets)."""

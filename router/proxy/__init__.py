"""The HTTP edge: handlers, request parsing, the relay, the upstream client."""

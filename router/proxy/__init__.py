"""The HTTP edge: handlers, request parsing, admission, the relay."""

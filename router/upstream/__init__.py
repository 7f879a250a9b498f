"""The upstream client: speclane's own HTTP/1.1 client for the relay's hot path, and the
parser of an upstream's answers. It knows nothing of the HTTP edge (``router.proxy``)."""

"""Front doors other than OpenAI's: Anthropic's Messages API and Ollama's API.

Each door is a pair of pure translators (its request in -> the OpenAI request the router
routes and forwards; the OpenAI answer out -> its answer) and a thin handler that runs the
same pipeline as the OpenAI endpoints (``router.proxy.handlers.proxy``). Backends keep
receiving OpenAI requests: the translation happens once, at the edge.
"""

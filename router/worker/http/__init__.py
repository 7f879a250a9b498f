"""The worker's HTTP side: the OpenAI-compatible app (``server``), its answer bodies and
stream chunks (``shapes``) and the one tokenizer thread (``tokenizing``)."""

"""The worker's HTTP side: the OpenAI-compatible app (``server``), its answer bodies and
stream chunks (``shapes``), a chat prompt's token ids (``render``) and the tokenizer threads
(``tokenizing``)."""

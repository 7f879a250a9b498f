"""The request every layer of the worker reads: a body validated into one frozen value
(``protocol``), below the decoding, drafting and engines that act on it."""

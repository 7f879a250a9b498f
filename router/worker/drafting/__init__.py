"""Where draft tokens come from and how many: the sources (``drafts``: prediction and prompt
lookup, ``suffix``, ``forced`` by a grammar), and each step's choice of source and length
(``draftchoice``, ``draftcontrol``, ``draftlength``); the batch's verify step that runs the
drafts is the engines' (``router.worker.engines.batchverify``)."""

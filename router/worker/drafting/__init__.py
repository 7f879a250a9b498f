"""Where draft tokens come from and how many: the sources (``drafts``: prediction and prompt
lookup, ``suffix``, ``forced`` by a grammar), each step's choice of source and length
(``draftchoice``, ``draftcontrol``, ``draftlength``) and the batch's verify step
(``batchverify``)."""

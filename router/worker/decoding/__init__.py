"""What the model may emit and how its output is read: grammars (``constrain``), tool calls
in the prompt and out of the text (``tools``), stop strings (``stops``)."""

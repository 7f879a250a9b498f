"""Pure routing decisions: classification, lane choice, load."""

"""The speclane command and its subcommands."""

"""The work behind each `morphogen` subcommand; `cli.py` only parses arguments and reports errors."""

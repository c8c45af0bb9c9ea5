"""The `lmprefs` command: `main` dispatches on the first word to a module per command group."""

from lmprefs.cli.dispatch import entry, main

__all__ = ["entry", "main"]

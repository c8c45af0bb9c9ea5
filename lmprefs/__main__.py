from lmprefs.cli.dispatch import entry

entry()

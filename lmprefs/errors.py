"""The one exception type the CLI turns into a single line and exit code 2: a user's mistake, not a bug."""


class UserError(Exception):
    """Bad input: the message names the value, where it came from, and the fix."""

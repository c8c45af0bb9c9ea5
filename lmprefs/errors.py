"""The one exception type the CLI turns into a single line and exit code 2: a user's mistake, not a bug."""


class UserError(Exception):
    """Bad input: the message names the value, where it came from, and the fix."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception as "TypeName: its message's first line" (at most `limit` characters of it), for the one line a
    UserError gives about a library's failure."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit] if lines else 'no message'}"

"""One exception type for every problem a user can cause: the CLI turns it into a message and exit code 2."""


class XpressError(ValueError):
    """Bad input or a mismatched/missing model, with a message that names the problem."""

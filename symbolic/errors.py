"""The one exception type for errors a user can cause."""

__all__ = ["SplitformerError"]


class SplitformerError(Exception):
    """Bad input: a malformed scheme, an unknown operator, sizes that do not fit.

    The message is one line; the command line prints it as ``error: <message>``.
    """

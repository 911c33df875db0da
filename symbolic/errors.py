"""The one exception type for errors a user can cause."""

__all__ = ["SplitformerError", "NotReal"]


class SplitformerError(Exception):
    """Bad input: a malformed scheme, an unknown operator, sizes that do not fit.

    The message is one line; the command line prints it as ``error: <message>``.
    """


class NotReal(ArithmeticError):
    """A value of a scheme's formulas that is not real (the log or a root of a negative number), met by an exact
    evaluation: the formulas are not defined at the state evaluated. The checks report it as such."""

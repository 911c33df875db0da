"""A check that raises is a failed check: its exception becomes a ``fail`` with the reason.

A valid scheme never makes ``splitformer check`` end in a traceback: an exception other than
``SplitformerError`` (bad input, reported as ``error: …``) inside a group of checks is a bug in
the code checked or in the check itself, and is reported as that group's failure, naming the
exception and where it was raised.

A division by an exact 0 in the exact evaluators (mpmath's, SymPy's, or the evaluators' own arithmetic) is the
scheme's own (its formula is undefined at the check's point) and is said so; any other exception is a crash. NumPy's warnings of non-finite values are silenced: the checks
say in their details where an output is not finite.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from splitformer.symbolic.errors import NotReal, SplitformerError

from .statements import Check

__all__ = ["guarded", "DIVIDES_BY_ZERO"]

#: Why a check in exact arithmetic has no value where a formula of the scheme divides by an exact 0 (a property of
#: the scheme, not a crash: a plug-in's ``u / ∫ H(p(x) − p(η)) dη`` at the first token).
DIVIDES_BY_ZERO = ("a formula of the scheme divides by zero at the check's point, in exact arithmetic: it is undefined "
                   "there (a quotient by a sum or integral that is 0, not stopped by a factor exactly 0, as a mean "
                   "over no key is)")
#: Where an exact evaluator divides: mpmath's and SymPy's numbers (their packages), the evaluators' own arithmetic.
_EXACT_PACKAGES = ("mpmath", "sympy")
_EXACT_FILES = frozenset({"numeric_expressions.py", "evaluate.py", "definitions.py", "semantics.py"})


def guarded(check_id: str, scheme: str | None, checks: Callable[[], Iterable[Check] | Check | None]) -> list[Check]:
    """The checks ``checks()`` returns, or one failed check ``check_id`` when it raises."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a check reports what is not finite, in its own words
            result = checks()
    except SplitformerError:
        raise
    except ZeroDivisionError as error:
        if not any(_exact(frame.filename) for frame in traceback.extract_tb(error.__traceback__)[-2:]):
            return _crashed(check_id, scheme, error)
        return [Check(check_id, scheme, f"The checks {check_id} evaluate the scheme at their points.", "numeric", False,
                      f"{DIVIDES_BY_ZERO}; raised at {_place(error)}")]
    except NotReal as error:
        return [Check(check_id, scheme, f"The checks {check_id} evaluate the scheme at their points.", "numeric", False,
                      f"the scheme's formulas have no real value at the check's state: {error} (the log or a root "
                      "of a negative entry: no real number, NaN in the emitted code)")]
    except Exception as error:  # noqa: BLE001 - every failure inside a check is reported, never a traceback
        return _crashed(check_id, scheme, error)
    if result is None:
        return []
    return [result] if isinstance(result, Check) else list(result)


def _exact(filename: str) -> bool:
    """``filename`` is a file of an exact evaluator: in mpmath's or SymPy's package, or one of splitformer's own."""
    path = Path(filename)
    return path.name in _EXACT_FILES or any(package in path.parts for package in _EXACT_PACKAGES)


def _crashed(check_id: str, scheme: str | None, error: BaseException) -> list[Check]:
    return [Check(check_id, scheme, f"The checks {check_id} run to completion.", "crashed", False,
                  f"raised {type(error).__name__}: {error} at {_place(error)}")]


def _place(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame that raised ``error``."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"

"""Argument checks of the generated modules, either backend: a ValueError or TypeError naming the
argument, before any work. Inlined into a generated module where it calls them
(``codegen.runtime_source``); plain Python, so the module imports only the standard library."""

import numbers
from collections.abc import Mapping


# --- argument checks: a ValueError or TypeError naming the argument, before any work ---
_LARGEST_FLOAT = 1.7976931348623157e308  # sys.float_info.max


def _as_read(params, *target, name="params"):
    """``params`` that can say why they would not compute their source here (``splitformer.adapters.Adapted``: its
    ``unlike`` method, given this module's globals and the call's arguments, or a Block) are refused when they do,
    the error naming them as ``name``."""
    unlike = getattr(type(params), "unlike", None)
    problem = unlike(params, *target) if callable(unlike) else None
    if problem:
        raise ValueError(f"{name}: {problem}")


def _size(axis, params, table, shape):
    """The size of ``axis`` as the parameters of ``table`` present give it (``shape`` reads one's shape), taken from
    the one with the fewest axes that names it: a bias before its kernel, so that a transposed kernel is what a
    mismatch names (``head.W`` (5, 12) is expected (12, 5), not (12, 12))."""
    named = [(name, axes) for name, axes in sorted(table.items(), key=lambda item: len(item[1]))
             if axis in axes and name in params]
    for name, axes in named:
        if len(shape(params[name])) == len(axes):
            return shape(params[name])[axes.index(axis)]
    return next((shape(params[name])[-1] for name, _ in reversed(named) if shape(params[name])), 0)  # a rank off


def _integer(name, value, minimum):
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):  # an int: fast
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _finite(value):
    """Whether the real ``value`` is a finite float: NaN is not, nor an int past float's range (float() overflows).
    A NumPy float32 is widened first: compared with the largest float64 as it is, that bound overflows float32."""
    try:
        exact = type(value) is not float and isinstance(value, numbers.Integral)  # a float: fast
        return abs(value if exact else float(value)) <= _LARGEST_FLOAT
    except OverflowError:  # a Fraction past float's range
        return False


def _real(name, value):
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):  # a float: fast
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")


def _epsilon(eps):
    _real("eps", eps)
    if not (_finite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


def _dropout_rate(dropout):
    _real("dropout", dropout)
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must lie in [0, 1], got {dropout}")
    return float(dropout)


def _mapping(name, value):
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of canonical names to arrays, got {type(value).__name__}")
    return value


def _integers(name, values, minimum):
    if isinstance(values, Mapping) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list with one int per stage, got {type(values).__name__}")
    return [_integer(f"{name}[{index}]", value, minimum) for index, value in enumerate(values)]


def _pair(name, value, minimum):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(f"{name} must be (height, width), got {value!r}")
    return tuple(_integer(name, size, minimum) for size in value)


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _unread(name, value, default):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value != default:
        raise ValueError(f"{name} must be {default}, got {value!r}: no operator of this network reads it (its network "
                         f"file fixes each one's {name})")
    return int(value)


def _choice(name, value, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, choices))}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be {' or '.join(map(repr, choices))}, got {value!r}")
    return value


def _buckets(n_buckets, max_distance, bidirectional):
    """Refuse a table of ``n_buckets`` whose logarithmic buckets T5's formula cannot form: it divides by
    log(max_distance / e), e = ⌊B/2⌋ exact buckets of the B per direction (n_buckets, halved when bidirectional)."""
    per_direction = n_buckets // 2 if bidirectional else n_buckets
    exact = per_direction // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"n_buckets = {n_buckets} gives {exact} exact buckets per direction"
                         f"{' (bidirectional: half of them each way)' if bidirectional else ''}; the scheme's "
                         f"max_distance = {max_distance} must exceed them, and they must be >= 1 (T5's buckets "
                         f"divide by log(max_distance / {exact}))")


class GridTooSmall(ValueError):
    """An image too small for a grid network's operators: a grid of its field or transfer would have no points."""

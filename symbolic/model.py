"""Whole models: an initial-condition operator, N steps of a block scheme, a readout.

A model file (TOML, built-ins in ``symbolic/models/``) names the embedding operator that
gives ``u(x, y, 0) = f(x, y)``, the block scheme whose steps advance ``u`` in depth (with
its activation and whether the stack ends with a final projection), and the readout
functional applied to ``u(·, ·, T)``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .builtins import is_model, model_names, model_summary, model_text
from .errors import SplitformerError
from .kinds import OPERATOR_KINDS
from .operators import Operator
from .scheme import Scheme
from .names import check_line, check_scheme_name
from .scheme_file import load_scheme, parse_scheme, read_source, scheme_path
from . import cnn_operators, cvt_operators, vision_operators  # noqa: F401 - register the vision operator kinds

__all__ = ["ModelSpec", "GridModelSpec", "MultiscaleSpec", "NetworkSpec", "load_model", "load_scheme_or_network",
           "is_network_file", "network_family", "model_names", "model_summary", "is_model"]

_TOP_KEYS = {"name", "summary", "embedding", "steps", "readout"}
_GRID_KEYS = {"name", "summary", "operators", "step"}
_OPTIONS = {"kernel", "stride", "padding", "inputs", "outputs"}


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model file."""

    name: str
    summary: str
    embedding: Operator
    scheme: Scheme
    final_norm: bool
    readout: Operator

    @property
    def module_name(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class GridModelSpec:
    """One step on the 2-D grid, ``u⁺ = Proj(R u + Δt F(u))``, of a convolutional network.

    ``field`` lists the operators of ``F`` in the order they apply; ``transfer`` those of the
    restriction ``R`` to the new grid (empty: the identity); ``projection`` the operator of
    the final projection (``None``: none).
    """

    name: str
    summary: str
    operators: dict[str, Operator]
    field: tuple[str, ...]
    transfer: tuple[str, ...]
    projection: str | None

    @property
    def module_name(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class MultiscaleSpec:
    """A multiscale model (``cvt``): the stage composition of ``symbolic/cvt.py``."""

    name: str
    summary: str

    @property
    def module_name(self) -> str:
        return self.name.replace("-", "_")


#: Any parsed network file.
NetworkSpec = ModelSpec | GridModelSpec | MultiscaleSpec


#: What a multiscale model file must name: the operator kinds ``symbolic/cvt.py`` composes.
MULTISCALE = {
    "stage": {"embedding": "convolution", "embedding_norm": "layer-norm", "projections": "depthwise-convolution",
              "projection_norm": "batch-norm", "attention": "convolutional-attention", "ffn": "feed-forward",
              "activation": "gelu"},
    "readout": {"norm": "layer-norm", "head": "class-token-head"},
}


def _multiscale(document: dict, where: str) -> MultiscaleSpec:
    unknown = sorted(set(document) - {"name", "summary", "composition", *MULTISCALE})
    if unknown:
        raise SplitformerError(f"{where}: unknown field {unknown[0]!r}")
    for table, expected in MULTISCALE.items():
        if document.get(table) != expected:
            raise SplitformerError(f"{where}: {table}: a multiscale model composes exactly {expected}")
    return MultiscaleSpec(*_identity(document, where))


def _grid_operator(key: str, table: object, where: str) -> Operator:
    if not isinstance(table, dict) or "kind" not in table:
        raise SplitformerError(f"{where}: operators.{key}: expected a table with 'kind'")
    options = {name: value for name, value in table.items() if name != "kind"}
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise SplitformerError(f"{where}: operators.{key}: unknown option {unknown[0]!r}")
    kind = table["kind"]
    if kind not in OPERATOR_KINDS:
        raise SplitformerError(f"{where}: operators.{key}.kind: unknown operator kind {kind!r}")
    try:
        return OPERATOR_KINDS[kind](key, **options)
    except TypeError:
        raise SplitformerError(f"{where}: operators.{key}: options {sorted(options)} do not fit kind {kind!r}") from None


def _grid_model(document: dict, where: str) -> GridModelSpec:
    unknown = sorted(set(document) - _GRID_KEYS)
    if unknown:
        raise SplitformerError(f"{where}: unknown field {unknown[0]!r}")
    operators = {key: _grid_operator(key, table, where) for key, table in document["operators"].items()}
    step = document.get("step", {})
    field_keys = tuple(step.get("field", ()))
    transfer = tuple(step.get("transfer", ()))
    projection = step.get("projection")
    for key in (*field_keys, *transfer, *([projection] if projection else [])):
        if key not in operators:
            raise SplitformerError(f"{where}: step names unknown operator {key!r}")
    if not field_keys:
        raise SplitformerError(f"{where}: step.field: name at least one operator")
    return GridModelSpec(*_identity(document, where), operators, field_keys, transfer, projection)


def _operator(table: object, where: str) -> Operator:
    if not isinstance(table, dict) or set(table) != {"operator", "kind"}:
        raise SplitformerError(f"{where}: expected a table with 'operator' and 'kind'")
    kind = table["kind"]
    if kind not in OPERATOR_KINDS:
        raise SplitformerError(f"{where}.kind: unknown operator kind {kind!r}")
    return OPERATOR_KINDS[kind](str(table["operator"]))


def _document(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except ValueError as error:  # TOMLDecodeError, and integers beyond Python's digit limit
        raise SplitformerError(f"{where}: invalid TOML: {error}") from None
    except RecursionError:
        raise SplitformerError(f"{where}: invalid TOML: arrays or tables nested too deeply") from None


#: The top-level keys that make a TOML document a network file rather than a block scheme (whose
#: keys include ``operators`` and ``steps``, never these).
_NETWORK_KEYS = {"embedding", "readout", "step", "composition"}


def _identity(document: dict, where: str) -> tuple[str, str]:
    """A network file's name and summary, checked as a scheme's are (they become file names and docstrings)."""
    for key in ("name", "summary"):
        if not isinstance(document.get(key), str):
            raise SplitformerError(f"{where}: {key}: expected a string")
    try:
        return check_scheme_name(document["name"]), check_line(document["summary"], "summary")
    except SplitformerError as error:
        raise SplitformerError(f"{where}: {error}") from None


def parse_model(text: str, where: str) -> NetworkSpec:
    """A network file's text → its spec; errors name ``where`` and the key."""
    document = _document(text, where)
    if document.get("composition") == "multiscale":
        return _multiscale(document, where)
    if "operators" in document:
        return _grid_model(document, where)
    unknown = sorted(set(document) - _TOP_KEYS)
    missing = sorted(_TOP_KEYS - set(document))
    if unknown or missing:
        raise SplitformerError(f"{where}: {'unknown' if unknown else 'missing'} field {(unknown or missing)[0]!r}")
    steps = document["steps"]
    if not isinstance(steps, dict) or not isinstance(steps.get("scheme"), str):
        raise SplitformerError(f"{where}: steps.scheme: expected the name of a block scheme")
    scheme = load_scheme(steps["scheme"])
    if "activation" in steps:
        scheme = scheme.with_activation(steps["activation"])
    final_norm = steps.get("final_norm", scheme.final_norm)
    if not isinstance(final_norm, bool):
        raise SplitformerError(f"{where}: steps.final_norm: expected true or false")
    return ModelSpec(*_identity(document, where),
                     _operator(document["embedding"], f"{where}: embedding"), scheme, final_norm,
                     _operator(document["readout"], f"{where}: readout"))


def load_model(name_or_path: str | os.PathLike) -> NetworkSpec:
    """A built-in network by name, or a network file by path."""
    name_or_path = os.fspath(name_or_path)
    if is_model(name_or_path):
        return parse_model(model_text(name_or_path), f"built-in network {name_or_path!r}")
    return parse_model(read_source(Path(name_or_path), "network file"), name_or_path)


def is_network_file(text: str) -> bool:
    """Whether a TOML text is a network file (an ``embedding`` or ``readout``, a grid ``step`` or a
    ``composition``) rather than a block scheme; unreadable TOML is neither (``False``)."""
    try:
        document = tomllib.loads(text.removeprefix("\ufeff"))
    except (ValueError, RecursionError):
        return False
    return bool(_NETWORK_KEYS & set(document))


def load_scheme_or_network(name_or_path: str | os.PathLike) -> Scheme | NetworkSpec:
    """A built-in scheme or network by name, or a scheme or network file by path (read once)."""
    if isinstance(name_or_path, (str, os.PathLike)) and is_model(os.fspath(name_or_path)):
        return load_model(name_or_path)
    path = scheme_path(name_or_path)
    if path is None:
        return load_scheme(name_or_path)
    text = read_source(path, "scheme file")
    return parse_model(text, str(path)) if is_network_file(text) else parse_scheme(text, str(path))


def _composition(spec: NetworkSpec) -> tuple:
    """What a network computes, without its name and summary (a grid network's operators by kind and options)."""
    if isinstance(spec, GridModelSpec):
        operators = tuple((key, operator.kind, repr(operator)) for key, operator in spec.operators.items())
        return ("grid", operators, spec.field, spec.transfer, spec.projection)
    if isinstance(spec, MultiscaleSpec):
        return ("multiscale",)
    return ("tokens", spec.embedding.kind, spec.readout.kind)


def network_family(spec: NetworkSpec) -> str | None:
    """The built-in network whose composition ``spec`` shares (its scheme may differ), or ``None``:
    the evaluators and sizes of the network checks are written per family."""
    return next((name for name in model_names() if _composition(load_model(name)) == _composition(spec)), None)

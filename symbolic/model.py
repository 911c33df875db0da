"""Whole models: an initial-condition operator, N steps of a block scheme, a readout.

A model file (TOML, built-ins in ``symbolic/models/``) names the embedding operator that
gives ``u(x, y, 0) = f(x, y)``, the block scheme whose steps advance ``u`` in depth (with
its activation and whether the stack ends with a final projection), and the readout
functional applied to ``u(·, ·, T)``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .builtins import is_model, model_names, model_summary, model_text
from .errors import SplitformerError
from .kinds import OPERATOR_KINDS
from .operators import Operator
from .scheme import Scheme
from .scheme_file import load_scheme
from . import cnn_operators, cvt_operators, vision_operators  # noqa: F401 - register the vision operator kinds

__all__ = ["ModelSpec", "GridModelSpec", "MultiscaleSpec", "load_model", "model_names", "model_summary", "is_model"]

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
    return MultiscaleSpec(str(document["name"]), str(document["summary"]))


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
    return GridModelSpec(str(document["name"]), str(document["summary"]), operators, field_keys, transfer, projection)


def _operator(table: object, where: str) -> Operator:
    if not isinstance(table, dict) or set(table) != {"operator", "kind"}:
        raise SplitformerError(f"{where}: expected a table with 'operator' and 'kind'")
    kind = table["kind"]
    if kind not in OPERATOR_KINDS:
        raise SplitformerError(f"{where}.kind: unknown operator kind {kind!r}")
    return OPERATOR_KINDS[kind](str(table["operator"]))


def parse_model(text: str, where: str) -> ModelSpec | GridModelSpec | MultiscaleSpec:
    """A model file's text → ``ModelSpec``; errors name ``where`` and the key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SplitformerError(f"{where}: invalid TOML: {error}") from None
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
    return ModelSpec(str(document["name"]), str(document["summary"]),
                     _operator(document["embedding"], f"{where}: embedding"), scheme, final_norm,
                     _operator(document["readout"], f"{where}: readout"))


def load_model(name_or_path: str) -> ModelSpec | GridModelSpec | MultiscaleSpec:
    """A built-in model by name, or a model file by path."""
    if is_model(name_or_path):
        return parse_model(model_text(name_or_path),
                           f"built-in model {name_or_path!r}")
    path = Path(name_or_path)
    try:
        return parse_model(path.read_text(encoding="utf-8"), str(path))
    except OSError as error:
        raise SplitformerError(f"cannot read model file {name_or_path}: {error.strerror}") from None

"""Whole models: an initial-condition operator, N steps of a block scheme, a readout.

A model file (TOML, built-ins in ``symbolic/models/``) names the embedding operator that
gives ``u(x, y, 0) = f(x, y)``, the block scheme whose steps advance ``u`` in depth (with
its activation and whether the stack ends with a final projection), and the readout
functional applied to ``u(·, ·, T)``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import SplitformerError
from .operators import OPERATOR_KINDS, Operator
from .scheme import Scheme
from .scheme_file import load_scheme
from . import vision_operators  # noqa: F401 - registers the vision operator kinds

__all__ = ["ModelSpec", "load_model", "model_names", "model_summary", "is_model"]

_TOP_KEYS = {"name", "summary", "embedding", "steps", "readout"}


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


def _folder():
    return resources.files("splitformer.symbolic") / "models"


def model_names() -> list[str]:
    """Names of the built-in models."""
    return sorted(entry.name[:-5] for entry in _folder().iterdir() if entry.name.endswith(".toml"))


def is_model(name: str) -> bool:
    return name in model_names()


def model_summary(name: str) -> str:
    return tomllib.loads((_folder() / f"{name}.toml").read_text(encoding="utf-8"))["summary"]


def _operator(table: object, where: str) -> Operator:
    if not isinstance(table, dict) or set(table) != {"operator", "kind"}:
        raise SplitformerError(f"{where}: expected a table with 'operator' and 'kind'")
    kind = table["kind"]
    if kind not in OPERATOR_KINDS:
        raise SplitformerError(f"{where}.kind: unknown operator kind {kind!r}")
    return OPERATOR_KINDS[kind](str(table["operator"]))


def parse_model(text: str, where: str) -> ModelSpec:
    """A model file's text → ``ModelSpec``; errors name ``where`` and the key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SplitformerError(f"{where}: invalid TOML: {error}") from None
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


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name, or a model file by path."""
    if is_model(name_or_path):
        return parse_model((_folder() / f"{name_or_path}.toml").read_text(encoding="utf-8"),
                           f"built-in model {name_or_path!r}")
    path = Path(name_or_path)
    try:
        return parse_model(path.read_text(encoding="utf-8"), str(path))
    except OSError as error:
        raise SplitformerError(f"cannot read model file {name_or_path}: {error.strerror}") from None

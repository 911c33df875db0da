"""Scheme files: TOML in, ``Scheme`` out, with one-line errors naming the file and key.

A scheme file is data. Nothing in it is evaluated; names that become identifiers in
generated code must be valid identifiers (``names``), every field is checked for its type,
numbers are small exact fractions, and files, nesting and compositions are bounded.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import sympy as sp

from .across_layers import across_layers_from_table
from .activations import ACTIVATIONS
from .builtins import builtin_names, builtin_text, network_names
from .errors import SplitformerError
from .exact_numbers import exact_number
from .file_kinds import open_regular
from .names import MAX_NAME, check_line, check_operator_name, check_scheme_name
from .kinds import OPERATOR_KINDS
from .scheme_fields import MAX_DEPTH
from .scheme import SOLVERS, STEP_CONTROLS, Heun, Parallel, RungeKutta, Scheme, Sequence, Substep, operator_options
from .tableaux import TABLEAUX, Tableau, make_tableau

__all__ = ["NETWORK_FIELDS", "load_scheme", "parse_scheme", "builtin_names", "is_builtin", "derive_arguments",
           "read_source", "scheme_path"]

#: A scheme file larger than this is not a scheme (``show /dev/zero`` must not read forever).
MAX_FILE_BYTES = 1 << 20
_TABLEAU_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_TOP_KEYS = {"name", "summary", "description", "activation", "final_norm", "operators", "steps",
             "order", "splitting_order", "tableaux", "causal", "across_layers",
             "padded_queries_outside"}
_SUBSTEP_KEYS = {"operator", "solver", "fraction", "on", "then", "step", "combine", "shift", "stream"}
_PARALLEL_KEYS = {"parallel", "weights"}
_HEUN_KEYS = {"rk2"}
_RK_KEYS = {"rk", "fields"}
_TABLEAU_KEYS = {"a", "b", "label"}


#: Top-level fields of a network file (``symbolic.network_spec``), never of a block scheme.
NETWORK_FIELDS = frozenset({"embedding", "readout", "step", "composition"})


class _Reader:
    """Validates one parsed TOML document; ``where`` names the file in every message."""

    def __init__(self, where: str):
        self.where = where
        self.tableaux: dict[str, Tableau] = {}

    def fail(self, key: str, message: str) -> SplitformerError:
        return SplitformerError(f"{self.where}: {key}: {message}")

    def typed(self, table: dict, key: str, kind: type, path: str, default: Any = ...) -> Any:
        if key not in table:
            if default is ...:
                raise self.fail(path or key, f"missing field {key!r}")
            return default
        value = table[key]
        if kind is float:
            ok = isinstance(value, (int, float, str)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            expected = "a number or a fraction string" if kind is float else kind.__name__  # as exact_number says
            raise self.fail(f"{path}.{key}" if path else key, f"expected {expected}, got {type(value).__name__}")
        return value

    def unknown(self, table: dict, allowed: set[str], path: str) -> None:
        extra = sorted(set(table) - allowed)
        if extra and not path and set(extra) & NETWORK_FIELDS:
            raise SplitformerError(f"{self.where}: this is a network file (its field "
                                   f"{sorted(set(extra) & NETWORK_FIELDS)[0]!r}), where a block scheme is expected "
                                   "(derive, show and check take networks; compare, study and a network's steps.scheme "
                                   "take block schemes)")
        if extra:
            raise self.fail(path or extra[0], f"unknown field {extra[0]!r} (allowed: {', '.join(sorted(allowed))})")

    def number(self, value: Any, path: str) -> sp.Rational:
        try:
            return exact_number(value)
        except ValueError as error:
            raise self.fail(path, str(error)) from None

    def scheme(self, document: dict, source: str) -> Scheme:
        self.unknown(document, _TOP_KEYS, "")
        name = self.typed(document, "name", str, "")
        try:
            check_scheme_name(name)
        except SplitformerError as error:
            raise self.fail("name", str(error)) from None
        summary = self.typed(document, "summary", str, "")
        try:
            check_line(summary, "summary")
        except SplitformerError as error:
            raise SplitformerError(f"{self.where}: {error}") from None
        activation = self.typed(document, "activation", str, "", "relu")
        if activation not in ACTIVATIONS:
            raise self.fail("activation", f"unknown activation {activation!r} (known: {', '.join(sorted(ACTIVATIONS))})")
        operators, options = self.operators(self.typed(document, "operators", dict, ""))
        for method, table in self.typed(document, "tableaux", dict, "", {}).items():
            self.tableaux[method] = tableau = self.tableau(method, table, f"tableaux.{method}")
            registered = TABLEAUX.get(method)
            if registered is not None and (registered.a, registered.b) != (tableau.a, tableau.b):
                raise self.fail(f"tableaux.{method}", f"{method!r} is a registered method with other coefficients "
                                "(its name in the report and the code would be wrong): name yours otherwise")
        steps = self.typed(document, "steps", list, "")
        body = self.sequence(steps, "steps", operators, 0)
        if not body.steps:
            raise self.fail("steps", "empty composition: a scheme needs at least one substep")
        scheme = Scheme(
            name=name,
            summary=summary,
            operators=operators,
            body=body,
            activation=activation,
            # the module is named without the activation the file declares (gpt2, llama); only
            # another one (``--activation``) is appended
            declared_activation=activation,
            causal=self.typed(document, "causal", bool, "", False),
            padded_queries_outside=self.typed(document, "padded_queries_outside", bool, "", False),
            final_norm=self.typed(document, "final_norm", bool, "", False),
            description=self.typed(document, "description", str, "", "").strip(),
            source=source,
            claims=self.claims(document),
            options=options,
            across_layers=(across_layers_from_table(self.typed(document, "across_layers", dict, ""), self.fail)
                           if "across_layers" in document else None),
        )
        try:
            scheme.check()
        except SplitformerError as error:
            raise SplitformerError(f"{self.where}: {error}") from None
        return scheme

    def claims(self, document: dict) -> dict[str, int]:
        claims = {}
        for key in ("order", "splitting_order"):
            value = self.typed(document, key, int, "", None)
            if value is not None:
                if value < 1:
                    raise self.fail(key, f"an order is a positive integer, got {value}")
                claims[key] = value
        return claims

    def operators(self, table: dict) -> tuple[dict[str, str], dict[str, dict]]:
        """Kinds by key, and the options of the keys written as ``{ kind = "…", option = … }``."""
        if not table:
            raise self.fail("operators", "empty table: name at least one operator")
        result, options = {}, {}
        for key, kind in table.items():
            path = f"operators.{key}"
            try:
                check_operator_name(key)
            except SplitformerError as error:
                raise self.fail("operators", str(error)) from None
            if isinstance(kind, dict):
                options[key] = {name: value for name, value in kind.items() if name != "kind"}
                kind = self.typed(kind, "kind", str, path)
            if not isinstance(kind, str):
                raise self.fail(path, f"expected str or a table with 'kind', got {type(kind).__name__}")
            block_kinds = sorted(name for name, cls in OPERATOR_KINDS.items() if not getattr(cls, "model_only", False))
            if kind in OPERATOR_KINDS and kind not in block_kinds:
                raise self.fail(path, f"{kind!r} is a network's operator, and this file has no [step] applying it: a "
                                "grid network file names its operators in [operators] and applies them in [step] "
                                f"(a block scheme's operators: {', '.join(block_kinds)})")
            if kind not in block_kinds:
                raise self.fail(path, f"unknown operator {kind!r} (known: {', '.join(block_kinds)})")
            if key in options:
                self.options(OPERATOR_KINDS[kind], options[key], path)
            result[key] = kind
        return result, options

    def options(self, cls: type, options: dict, path: str) -> None:
        """Each option is one the kind takes, of its default's type; an activation must be known."""
        allowed = operator_options(cls)
        for name, value in options.items():
            if name not in allowed:
                raise self.fail(f"{path}.{name}", f"unknown option of {cls.kind!r} (options: {', '.join(allowed) or 'none'})")
            if isinstance(value, float) and not math.isfinite(value):  # it would reach the code as `oo`, `nan`
                raise self.fail(f"{path}.{name}", f"{value} is not a finite number")
            if name == "activation":
                if not isinstance(value, str) or value not in ACTIVATIONS:
                    raise self.fail(f"{path}.activation", f"unknown activation {value!r} (known: {', '.join(sorted(ACTIVATIONS))})")
            elif allowed[name] is None or allowed[name] is MISSING:  # no default to take the type from
                if not isinstance(value, (bool, int, float, str)):
                    raise self.fail(f"{path}.{name}", f"expected a number, string or boolean, got {type(value).__name__}")
            elif type(value) is not type(allowed[name]):
                raise self.fail(f"{path}.{name}", f"expected {type(allowed[name]).__name__}, got {type(value).__name__}")

    def sequence(self, steps: list, path: str, operators: dict[str, str], depth: int) -> Sequence:
        if depth > MAX_DEPTH:
            raise self.fail(path, f"parallel steps nest deeper than {MAX_DEPTH} levels")
        parsed = []
        for position, step in enumerate(steps):
            where = f"{path}[{position}]"
            if not isinstance(step, dict):
                raise self.fail(where, f"expected a table, got {type(step).__name__}")
            if "parallel" in step:
                parsed.append(self.parallel(step, where, operators, depth))
            elif "rk2" in step:
                parsed.append(self.heun(step, where, operators))
            elif "rk" in step:
                parsed.append(self.runge_kutta(step, where, operators))
            else:
                parsed.append(self.substep(step, where, operators))
        return Sequence(tuple(parsed))

    def substep(self, step: dict, where: str, operators: dict[str, str]) -> Substep:
        self.unknown(step, _SUBSTEP_KEYS, where)
        operator = self.typed(step, "operator", str, where)
        if operator not in operators:
            raise self.fail(f"{where}.operator", f"unknown operator {operator!r} (declared: {', '.join(operators)})")
        solver = self.typed(step, "solver", str, where)
        if solver not in SOLVERS:
            raise self.fail(f"{where}.solver", f"unknown solver {solver!r} (known: {', '.join(SOLVERS)})")
        fraction = self.number(self.typed(step, "fraction", float, where, 1), f"{where}.fraction")
        if fraction == 0:
            raise self.fail(f"{where}.fraction", "must not be 0 (a substep of no time is no substep); "
                            "a negative fraction steps backward")
        if solver == "projection" and fraction != 1:
            raise self.fail(f"{where}.fraction", "a projection has no fraction (the normal cone absorbs Δt)")
        on, then, combine, shift = (self.typed(step, role, str, where, None) for role in ("on", "then", "combine", "shift"))
        for role, key in (("on", on), ("then", then), ("combine", combine), ("shift", shift)):
            if key is not None and key not in operators:
                raise self.fail(f"{where}.{role}", f"unknown operator {key!r} (declared: {', '.join(operators)})")
        control = self.typed(step, "step", str, where, "fixed")
        if control not in STEP_CONTROLS:
            raise self.fail(f"{where}.step", f"unknown step {control!r} (known: {', '.join(STEP_CONTROLS)})")
        stream = self.typed(step, "stream", bool, where, False)
        return Substep(operator, solver, fraction, on, then, control, combine, shift, stream)

    def tableau(self, name: str, table: Any, path: str) -> Tableau:
        if not _TABLEAU_NAME.fullmatch(name) or len(name) > MAX_NAME:
            raise self.fail(path, f"{name[:MAX_NAME]!r} is not a tableau name (lower-case words joined by '-', "
                            f"at most {MAX_NAME} characters)")
        if not isinstance(table, dict):
            raise self.fail(path, f"expected a table with a and b, got {type(table).__name__}")
        self.unknown(table, _TABLEAU_KEYS, path)
        try:
            return make_tableau(name, self.typed(table, "a", list, path), self.typed(table, "b", list, path),
                                self.typed(table, "label", str, path, ""))
        except SplitformerError as error:
            raise self.fail(path, str(error)) from None

    def runge_kutta(self, step: dict, where: str, operators: dict[str, str]) -> RungeKutta:
        """``rk = "rk4"`` (a registered or ``[tableaux]`` name, or an inline ``{ a, b }``), ``fields = [...]``."""
        self.unknown(step, _RK_KEYS, where)
        method = step["rk"]
        if isinstance(method, dict):
            method = self.tableau("inline", method, f"{where}.rk")
        elif isinstance(method, str):
            if method in self.tableaux:
                method = self.tableaux[method]
            elif method in TABLEAUX:
                method = TABLEAUX[method]
            else:
                known = ", ".join(sorted({*TABLEAUX, *self.tableaux}))
                raise self.fail(f"{where}.rk", f"unknown Runge–Kutta tableau {method!r} (known: {known}; "
                                "or define it under [tableaux.NAME])")
        else:
            raise self.fail(f"{where}.rk", f"expected a tableau name or a table, got {type(method).__name__}")
        fields = self.fields(self.typed(step, "fields", list, where), f"{where}.fields", operators, "a Runge–Kutta step")
        return RungeKutta(fields, method)

    def heun(self, step: dict, where: str, operators: dict[str, str]) -> Heun:
        self.unknown(step, _HEUN_KEYS, where)
        return Heun(self.fields(self.typed(step, "rk2", list, where), f"{where}.rk2", operators, "an rk2 step"))

    def fields(self, fields: list, where: str, operators: dict[str, str], node: str) -> tuple[Substep, ...]:
        """The vector fields a Runge–Kutta step (``node`` in messages) sums."""
        if not fields:
            raise self.fail(where, f"empty composition: {node} needs at least one field")
        parsed = []
        for position, field in enumerate(fields):
            path = f"{where}[{position}]"
            if not isinstance(field, dict):
                raise self.fail(path, f"expected a table, got {type(field).__name__}")
            substep = self.substep({"solver": "explicit", **field}, path, operators)
            if substep.solver != "explicit":
                raise self.fail(f"{path}.solver", f"the stages of {node} evaluate vector fields: use 'explicit'")
            parsed.append(substep)
        return tuple(parsed)

    def parallel(self, step: dict, where: str, operators: dict[str, str], depth: int) -> Parallel:
        self.unknown(step, _PARALLEL_KEYS, where)
        branches = self.typed(step, "parallel", list, where)
        if not branches:
            raise self.fail(f"{where}.parallel", "empty composition: a parallel step needs branches")
        parsed = []
        for position, branch in enumerate(branches):
            if not isinstance(branch, list):
                raise self.fail(f"{where}.parallel[{position}]", f"expected a list of substeps, got {type(branch).__name__}")
            parsed.append(self.sequence(branch, f"{where}.parallel[{position}]", operators, depth + 1))
        default = [1] * len(branches)
        raw = self.typed(step, "weights", list, where, [f"1/{len(branches)}" for _ in default])
        if len(raw) != len(branches):
            raise self.fail(f"{where}.weights", f"{len(raw)} weights for {len(branches)} branches")
        weights = tuple(self.number(value, f"{where}.weights[{n}]") for n, value in enumerate(raw))
        if sum(weights) != 1:
            raise self.fail(f"{where}.weights", f"weights must sum to 1, they sum to {sum(weights)}")
        return Parallel(tuple(parsed), weights)


def parse_scheme(text: str, where: str = "<scheme>") -> Scheme:
    """Parse the text of a scheme file; errors name ``where``. A leading UTF-8 byte-order mark is skipped."""
    if not isinstance(text, str):
        raise SplitformerError(f"{where}: expected the text of a scheme file (str), got {type(text).__name__}")
    text = text.removeprefix("\ufeff")
    try:
        document = tomllib.loads(text)
    except ValueError as error:  # TOMLDecodeError, and integers beyond Python's digit limit
        raise SplitformerError(f"{where}: invalid TOML: {error}") from None
    except RecursionError:
        raise SplitformerError(f"{where}: invalid TOML: arrays or tables nested too deeply") from None
    return _Reader(where).scheme(document, text)


def read_source(path: Path, what: str) -> str:
    """The UTF-8 text of the ``what`` (``"scheme file"``…) at ``path``: a regular file of at most
    ``MAX_FILE_BYTES``; every failure is one ``SplitformerError`` naming the path."""
    try:
        with open_regular(path) as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise SplitformerError(f"cannot read {what} {path}: {reason}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SplitformerError(f"{what} {str(path)!r} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SplitformerError(f"cannot read {what} {path}: not UTF-8 ({error.reason})") from None


def scheme_path(name_or_path: str | os.PathLike) -> Path | None:
    """``None`` for a built-in scheme's name, else the path of the file it names; one error for
    what is neither (a built-in network's name is told apart)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise SplitformerError(f"expected a scheme name or a path, got {type(name_or_path).__name__}")
    name_or_path = os.fspath(name_or_path)
    if name_or_path in builtin_names():
        return None
    known = ", ".join(builtin_names())
    if not name_or_path:
        raise SplitformerError(f"empty scheme name (built-in: {known}; or a path to a .toml file)")
    path = Path(name_or_path)
    try:
        exists = path.suffix == ".toml" or path.exists()
    except (OSError, ValueError) as error:
        raise SplitformerError(f"cannot read scheme file {name_or_path}: {getattr(error, 'strerror', None) or error}") from None
    if not exists:
        if name_or_path in network_names():
            raise SplitformerError(f"{name_or_path!r} is a built-in network, not a block scheme "
                                   f"(the CLI takes it: `splitformer derive {name_or_path}`, `show`, `check`)")
        raise SplitformerError(f"unknown scheme {name_or_path!r} (built-in: {known}; networks, for derive, show "
                               f"and check: {', '.join(network_names())}; or a path to a .toml file)")
    return path


def load_scheme(name_or_path: str | os.PathLike) -> Scheme:
    """A built-in scheme by name, or a scheme file by path."""
    path = scheme_path(name_or_path)
    if path is None:
        return parse_scheme(builtin_text(os.fspath(name_or_path)), f"built-in scheme {os.fspath(name_or_path)!r}")
    return parse_scheme(read_source(path, "scheme file"), str(path))


def derive_arguments(scheme: Scheme) -> str:
    """The arguments of ``splitformer derive`` that emit ``scheme``'s module, as its module and report print them:
    its name where it is the built-in of that name, else SCHEME_FILE (its file, which the scheme does not know);
    then its options."""
    name, _, options = scheme.derive_arguments.partition(" ")
    return " ".join(filter(None, (name if is_builtin(scheme) else "SCHEME_FILE", options)))


def is_builtin(scheme: Scheme) -> bool:
    """Whether ``scheme`` is the built-in of its name (same operators, same steps).

    A user file may carry a built-in's name (``name = "macaron"``) with other operators or
    steps; checks that hold only for the built-in are not run on it.
    """
    if scheme.name not in builtin_names():
        return False
    builtin = parse_scheme(builtin_text(scheme.name))
    return builtin.operators == scheme.operators and builtin.body == scheme.body

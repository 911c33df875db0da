"""Network files: a token network (an initial-condition operator, N steps of a block scheme, a readout), a grid
step ``u⁺ = Proj(R u + Δt F(u))``, or CvT's multiscale composition.

A token network's file (TOML, built-ins in ``symbolic/networks/``) names the embedding operator that
gives ``u(x, y, 0) = f(x, y)``, the block scheme whose steps advance ``u`` in depth (with
its activation and whether the stack ends with a final projection), and the readout
functional applied to ``u(·, ·, T)``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .builtins import builtin_names, is_network, network_names, network_summary, network_text
from .errors import SplitformerError
from .kinds import OPERATOR_KINDS
from .operators import Operator
from .scheme import Scheme
from .names import check_line, check_operator_name, check_scheme_name
from .scheme_file import NETWORK_FIELDS, load_scheme, parse_scheme, read_source, scheme_path
from .toml_text import toml_value
from . import cnn_operators, cvt_operators, vision_operators  # noqa: F401 - register the vision operator kinds

__all__ = ["check_network", "portable_text", "TokenNetworkSpec", "GridNetworkSpec", "MultiscaleSpec", "NetworkSpec", "load_network", "load_scheme_or_network",
           "is_network_file", "network_family", "network_fingerprint", "network_names", "network_summary", "is_network",
           "network_derive_argument", "application_names"]

_TOP_KEYS = {"name", "summary", "embedding", "steps", "readout"}
_GRID_KEYS = {"name", "summary", "operators", "step"}
_OPTIONS = {"kernel", "stride", "padding", "inputs", "outputs"}


@dataclass(frozen=True)
class TokenNetworkSpec:
    """A parsed token network file."""

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
class GridNetworkSpec:
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

    @property
    def reads_stride(self) -> bool:
        """Whether an operator strides by the network's ``stride`` argument (``resnet-block``); otherwise the network
        file fixes each stride (``unet-level``) and the generated code refuses a ``stride`` other than 1."""
        return any(getattr(operator, "stride", None) == "stride" for operator in self.operators.values())


@dataclass(frozen=True)
class MultiscaleSpec:
    """A multiscale network (``cvt``): the stage composition of ``symbolic/cvt.py``."""

    name: str
    summary: str

    @property
    def module_name(self) -> str:
        return self.name.replace("-", "_")


#: Any parsed network file.
NetworkSpec = TokenNetworkSpec | GridNetworkSpec | MultiscaleSpec


#: What a multiscale network file must name: the operator kinds ``symbolic/cvt.py`` composes.
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
            raise SplitformerError(f"{where}: {table}: a multiscale network composes exactly {expected}")
    return MultiscaleSpec(*_identity(document, where))


#: The kinds a grid network's step composes, and those of a token network's embedding and readout.
GRID_KINDS = ("convolution", "transposed-convolution", "batch-norm", "relu-projection")
EMBEDDING_KINDS, READOUT_KINDS = ("patch-embedding",), ("class-token-head",)
#: At most this many operators in a grid network (each is a derivation and a check).
MAX_GRID_OPERATORS = 32
#: Largest kernel, stride and padding a grid operator takes.
MAX_WINDOW = 64
#: Parameter prefixes a network's own operators may not take (the steps' and the final norm's).
RESERVED_NAMES = ("layers", "final_norm", "stages")


def _operator_name(name: object, where: str) -> str:
    """An operator name of a network file: an identifier (it becomes parameter names and code), not reserved."""
    if type(name) is not str:  # a str subclass may compare equal to a name and print other text
        raise SplitformerError(f"{where}: expected an operator name (a string), got {type(name).__name__}")
    try:
        check_operator_name(name)
    except SplitformerError as error:
        raise SplitformerError(f"{where}: {error}") from None
    if name in RESERVED_NAMES:
        raise SplitformerError(f"{where}: the operator name {name!r} is reserved ({', '.join(RESERVED_NAMES)})")
    return name


def _grid_option(name: str, value: object, where: str) -> object:
    """``inputs``/``outputs``: ``"c"`` or ``"y"``; ``stride`` may be ``"stride"`` (the network's stride argument);
    else an integer in range (it is printed into the emitted code)."""
    if name in ("inputs", "outputs"):
        if type(value) is not str or value not in ("c", "y"):
            raise SplitformerError(f'{where}.{name}: expected "c" (the input channels) or "y" (the features), got {value!r}')
        return value
    if name == "stride" and type(value) is str and value == "stride":
        return value
    low = 0 if name == "padding" else 1
    if type(value) is not int or not low <= value <= MAX_WINDOW:
        also = ' or "stride" (the stride argument)' if name == "stride" else ""
        raise SplitformerError(f"{where}.{name}: expected an integer from {low} to {MAX_WINDOW}{also}, got {value!r}")
    return value


def _grid_operator(key: str, table: object, where: str) -> Operator:
    key = _operator_name(key, f"{where}: operators")
    where = f"{where}: operators.{key}"
    if not isinstance(table, dict) or "kind" not in table:
        raise SplitformerError(f"{where}: expected a table with 'kind'")
    options = {name: value for name, value in table.items() if name != "kind"}
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise SplitformerError(f"{where}: unknown option {unknown[0]!r}")
    options = {name: _grid_option(name, value, where) for name, value in options.items()}
    kind = table["kind"]
    if kind not in GRID_KINDS:
        raise SplitformerError(f"{where}.kind: a grid step composes {', '.join(GRID_KINDS)}, not {str(kind)[:40]!r}")
    if not OPERATOR_KINDS[kind].contracts_channels and "inputs" in options:  # per channel: writes what it reads
        options.setdefault("outputs", options["inputs"])
    try:
        return OPERATOR_KINDS[kind](key, **options)
    except TypeError:
        raise SplitformerError(f"{where}: options {sorted(options)} do not fit kind {kind!r}") from None
    except SplitformerError as error:
        raise SplitformerError(f"{where}: {str(error).removeprefix(f'operator {key!r}: ')}") from None


def _names(step: dict, key: str, where: str) -> tuple[str, ...]:
    value = step.get(key, [])
    if not isinstance(value, (list, tuple)) or not all(type(name) is str for name in value):
        raise SplitformerError(f"{where}: step.{key}: expected a list of operator names")
    return tuple(value)


def _grid_network(document: dict, where: str) -> GridNetworkSpec:
    unknown = sorted(set(document) - _GRID_KEYS)
    if unknown:
        raise SplitformerError(f"{where}: unknown field {unknown[0]!r}")
    if "operators" not in document:
        raise SplitformerError(f"{where}: operators: missing (a grid step's file names its operators in [operators], "
                               "then applies them in [step])")
    if not isinstance(document["operators"], dict) or not isinstance(document.get("step", {}), dict):
        raise SplitformerError(f"{where}: operators and step must be tables")
    if len(document["operators"]) > MAX_GRID_OPERATORS:
        raise SplitformerError(f"{where}: more than {MAX_GRID_OPERATORS} operators")
    operators = {key: _grid_operator(key, table, where) for key, table in document["operators"].items()}
    step = document.get("step", {})
    unknown = sorted(set(step) - {"field", "transfer", "projection"})
    if unknown:
        raise SplitformerError(f"{where}: step: unknown field {unknown[0]!r}")
    field_keys, transfer = _names(step, "field", where), _names(step, "transfer", where)
    projection = step.get("projection")
    if projection is not None and type(projection) is not str:
        raise SplitformerError(f"{where}: step.projection: expected an operator name")
    for key in (*field_keys, *transfer, *([projection] if projection else [])):
        if key not in operators:
            raise SplitformerError(f"{where}: step names unknown operator {key!r}")
    if not field_keys:
        raise SplitformerError(f"{where}: step.field: name at least one operator")
    if len(field_keys) + len(transfer) > MAX_GRID_OPERATORS:
        raise SplitformerError(f"{where}: step: more than {MAX_GRID_OPERATORS} operators")
    _check_grid_uses(operators, field_keys, transfer, projection, where)
    unused = [key for key in operators if key not in (*field_keys, *transfer, projection)]
    if unused:  # as a scheme's: most likely a name mistyped in [step]
        raise SplitformerError(f"{where}: operator {unused[0]!r} is declared but the step never applies it (its "
                               "parameters would be required for nothing); remove it or name it in [step]")
    return GridNetworkSpec(*_identity(document, where), operators, field_keys, transfer, projection)


def _changes_grid(operator: Operator) -> bool:
    """Whether ``operator`` writes on another grid than it reads (a stride, a padding other than half the kernel, a
    prolongation)."""
    if operator.kind == "transposed-convolution":
        return True
    return operator.kind == "convolution" and (operator.stride != 1 or 2 * operator.padding != operator.kernel - 1)


def application_names(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The name of each application of the operators ``keys`` in the code (the field's, the transfer's, then the
    projection's, in order): an operator's key at its first application, ``<key><n>`` at its n-th."""
    return tuple(key if n == 1 else f"{key}{n}" for position, key in enumerate(keys)
                 for n in [keys[:position + 1].count(key)])


def _check_grid_uses(operators: dict[str, Operator], field: tuple[str, ...], transfer: tuple[str, ...],
                     projection: str | None, where: str) -> None:
    """The field has parameters; the transfer ``R`` has parameters of its own (the module tells ``R`` from the
    identity by them); each operator reads the channels the one before it wrote (``c`` first: u's; the projection
    those of the update, F's); an operator applied again is named ``<key><n>`` in the code
    (``application_names``), which no other application and no operator may be."""
    if not any(operators[key].parameters() for key in field):
        raise SplitformerError(f"{where}: step.field: no operator of the field has parameters (a convolution or a "
                               "BatchNorm); a grid step learns through them")
    shared = sorted(set(field + ((projection,) if projection else ())) & set(transfer))
    if shared:
        raise SplitformerError(f"{where}: step.transfer: {shared[0]!r} is in the "
                               f"{'field' if shared[0] in field else 'projection'} too; the transfer R needs "
                               "operators (and parameters) of its own")
    if transfer and not any(operators[key].parameters() for key in transfer):
        raise SplitformerError(f"{where}: step.transfer: no operator of it has parameters, so R cannot be told "
                               "from the identity; put a convolution or a BatchNorm in it, or leave it empty")
    updated, applied = "c", (*field, *transfer, *((projection,) if projection else ()))
    for part, keys in (("field", field), ("transfer", transfer), ("projection", (projection,) if projection else ())):
        channels = updated if part == "projection" else "c"  # u holds the input channels; each operator reads where
        for key in keys:                                     # the one before it wrote; the projection the update's
            operator = operators[key]
            if operator.inputs != channels:
                raise SplitformerError(
                    f'{where}: step.{part}: operators.{key} reads channels "{operator.inputs}" where the {part} '
                    f'{"reads" if part == "projection" else "holds"} "{channels}" (u holds the input channels c; an '
                    f'operator writes its outputs; the update R u + F(u) holds F\'s): set its inputs to "{channels}"'
                    + ("; it is applied more than once and an operator reads one kind of channels: give this "
                       "application an operator of its own" if applied.count(key) > 1 else ""))
            channels = operator.outputs
        updated = channels if part == "field" else updated
    if projection and operators[projection].outputs != operators[projection].inputs:
        raise SplitformerError(f'{where}: step.projection: operators.{projection} writes channels '
                               f'"{operators[projection].outputs}" from "{operators[projection].inputs}"; the projection '
                               "keeps the update's channels (the step's output is the update's shape): set its outputs "
                               f'to "{operators[projection].inputs}"')
    if projection and _changes_grid(operators[projection]):
        raise SplitformerError(f"{where}: step.projection: operators.{projection} changes the grid; the projection "
                               "acts on the update's grid (a stride of 1, padding (kernel - 1)/2, no transposed "
                               "convolution)")
    keys = (*field, *transfer, *((projection,) if projection else ()))
    for position, (key, name) in enumerate(zip(keys, application_names(keys))):
        if name != key and (name in operators or name in application_names(keys)[:position]):
            raise SplitformerError(f"{where}: step: application {keys[:position + 1].count(key)} of {key!r} is "
                                   f"named {name!r} in the code, as another operator or application is; rename "
                                   f"{name if name in operators else key!r}")


def _operator(table: object, where: str, kinds: tuple[str, ...]) -> Operator:
    if not isinstance(table, dict) or not {"operator", "kind"} <= set(table):
        raise SplitformerError(f"{where}: expected a table with 'operator' and 'kind'")
    unknown = sorted(set(table) - {"operator", "kind"}, key=str)
    if unknown:
        raise SplitformerError(f"{where}: unknown field {str(unknown[0])[:40]!r} (expected 'operator' and 'kind')")
    kind = table["kind"]
    if kind not in kinds:
        raise SplitformerError(f"{where}.kind: expected {' or '.join(kinds)}, got {str(kind)[:40]!r}")
    return OPERATOR_KINDS[kind](_operator_name(table["operator"], f"{where}.operator"))


def _document(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except ValueError as error:  # TOMLDecodeError, and integers beyond Python's digit limit
        raise SplitformerError(f"{where}: invalid TOML: {error}") from None
    except RecursionError:
        raise SplitformerError(f"{where}: invalid TOML: arrays or tables nested too deeply") from None


def _identity(document: dict, where: str) -> tuple[str, str]:
    """A network file's name and summary, checked as a scheme's are (they become file names and docstrings)."""
    for key in ("name", "summary"):
        if type(document.get(key)) is not str:
            raise SplitformerError(f"{where}: {key}: expected a string")
    try:
        return check_scheme_name(document["name"]), check_line(document["summary"], "summary")
    except SplitformerError as error:
        raise SplitformerError(f"{where}: {error}") from None


#: The fields of a token network's ``[steps]``.
_STEPS_KEYS = frozenset({"scheme", "activation", "final_norm"})


def parse_network(text: str, where: str, folder: Path | None = None) -> NetworkSpec:
    """A network file's text → its spec; errors name ``where`` and the key; a scheme file it names is
    read from ``folder`` (the network file's own)."""
    document = _document(text, where)
    if document.get("composition") == "multiscale":
        return _multiscale(document, where)
    if "operators" in document or "step" in document:
        return _grid_network(document, where)
    unknown = sorted(set(document) - _TOP_KEYS)
    missing = sorted(_TOP_KEYS - set(document))
    if unknown or missing:
        raise SplitformerError(f"{where}: {'unknown' if unknown else 'missing'} field {(unknown or missing)[0]!r}")
    steps = document["steps"]
    if isinstance(steps, list):
        raise SplitformerError(f"{where}: steps: a network file's [steps] is one table (its scheme, activation, "
                               "final_norm), not an array of tables [[steps]] as a scheme file's")
    if not isinstance(steps, dict) or not isinstance(steps.get("scheme"), str):
        raise SplitformerError(f"{where}: steps.scheme: expected the name of a block scheme")
    if not steps["scheme"].strip():
        raise SplitformerError(f"{where}: steps.scheme: empty; give a block scheme's name (pre-ln) or file (mine.toml)")
    unknown = sorted(set(steps) - _STEPS_KEYS, key=str)
    if unknown:
        raise SplitformerError(f"{where}: steps: unknown field {str(unknown[0])[:40]!r} (allowed: "
                               f"{', '.join(sorted(_STEPS_KEYS))})")
    try:
        scheme = load_scheme(_beside(steps["scheme"], folder))
    except SplitformerError as error:
        raise SplitformerError(f"{where}: steps.scheme: {error}") from None
    scheme = _one_layer_at_a_time(scheme, where)
    if "activation" in steps:  # refused where no operator takes it, as `derive --activation` refuses it
        try:
            scheme = scheme.with_activation(steps["activation"])
        except SplitformerError as error:
            raise SplitformerError(f"{where}: steps.activation: {error}") from None
    final_norm = steps.get("final_norm", scheme.final_norm)
    if not isinstance(final_norm, bool):
        raise SplitformerError(f"{where}: steps.final_norm: expected true or false")
    embedding = _operator(document["embedding"], f"{where}: embedding", EMBEDDING_KINDS)
    readout = _operator(document["readout"], f"{where}: readout", READOUT_KINDS)
    if embedding.key == readout.key:
        raise SplitformerError(f"{where}: the embedding and the readout are both named {embedding.key!r}")
    return TokenNetworkSpec(*_identity(document, where), embedding, scheme, final_norm, readout)


#: The sizes a token network gives each step (its ``_checked`` and its torch Model), besides the batch and tokens.
STEP_SIZES = ("d", "d_ff", "d_head", "n_heads")


def _one_layer_at_a_time(scheme: Scheme, where: str) -> Scheme:
    """``scheme`` unless a token network cannot step with it: a step is fed all the tokens, unmasked, and nothing else
    (no positions, memory, keyword constants or second state), one layer at a time, its parameters sized by
    ``STEP_SIZES`` alone, and has a parameter to count layers by."""
    def refused(problem: str) -> SplitformerError:
        return SplitformerError(f"{where}: steps.scheme: {scheme.name!r} {problem}; a token network feeds each step "
                                f"all its tokens and nothing else, with the sizes {', '.join(STEP_SIZES)}")

    if scheme.causal:
        raise refused("is causal (each token sees only those before it)")
    if scheme.across_layers is not None:
        raise SplitformerError(f"{where}: steps.scheme: {scheme.name!r} combines its layers "
                               f"({scheme.across_layers.method} across layers); a network steps one layer at a time")
    if scheme.streams:
        raise refused("reads a second state across layers (a stream)")
    operators = scheme.instantiate()
    for key, operator in operators.items():
        reads = [{"positions": "token positions"}.get(field.role, f"a {field.role}") for field in operator.input_fields
                 if operator.reads_input(field.name)]
        reads += [f"the keyword argument {constant.symbol.name}" for constant in operator.constants]
        if reads:
            raise refused(f"reads {reads[0]} (operator {key!r})")
        sizes = sorted({domain.code_name for parameter in operator.parameters() for domain in parameter.shape}
                       - set(STEP_SIZES), key=str)
        if sizes:
            option = f", set by its d_head = {operator.d_head}" if getattr(operator, "d_head", None) else ""
            raise refused(f"sizes a parameter of operator {key!r} by {sizes[0]}{option}")
    if not scheme.step_controls() and not any(operator.parameters() for operator in operators.values()):
        raise SplitformerError(f"{where}: steps.scheme: {scheme.name!r} has no parameter; a token network counts its "
                               "layers by their parameters (layers.N.…), so its step needs one (a projection "
                               "'on = \"layer-norm\"', a learned step, an operator with weights)")
    return scheme


def check_network(spec: object) -> NetworkSpec:
    """``spec`` (a network spec object, however made or edited) checked as its file would be: it is
    written back as a network file's tables, read again, and must be what was read, field by field."""
    if type(spec) not in (TokenNetworkSpec, GridNetworkSpec, MultiscaleSpec):
        raise SplitformerError(f"expected a network spec (TokenNetworkSpec, GridNetworkSpec, MultiscaleSpec), "
                               f"got {type(spec).__name__}")
    where = "network " + repr(spec.name)[:64]
    identity = {"name": spec.name, "summary": spec.summary}
    if type(spec) is MultiscaleSpec:
        read = MultiscaleSpec(*_identity(identity, where))
    elif type(spec) is GridNetworkSpec:
        if type(spec.operators) is not dict or type(spec.projection) not in (str, type(None)):
            raise SplitformerError(f"{where}: operators must be a dict and projection a name or None")
        operators = {key: {"kind": type(operator).kind, **_options(operator, f"{where}: operators")}
                     for key, operator in spec.operators.items()}
        read = _grid_network({**identity, "operators": operators, "step": {
            "field": spec.field, "transfer": spec.transfer,
            **({} if spec.projection is None else {"projection": spec.projection})}}, where)
    else:
        if type(spec.scheme) is not Scheme or type(spec.final_norm) is not bool:
            raise SplitformerError(f"{where}: scheme must be a Scheme and final_norm a bool")
        spec.scheme.check()
        embedding, readout = (_operator({"operator": operator.key, "kind": type(operator).kind,
                                         **_options(operator, f"{where}: {role}")}, f"{where}: {role}", kinds)
                              for operator, role, kinds in ((spec.embedding, "embedding", EMBEDDING_KINDS),
                                                            (spec.readout, "readout", READOUT_KINDS)))
        if embedding.key == readout.key:
            raise SplitformerError(f"{where}: the embedding and the readout are both named {embedding.key!r}")
        read = TokenNetworkSpec(*_identity(identity, where), embedding, _one_layer_at_a_time(spec.scheme, where),
                         spec.final_norm, readout)
    for name in vars(spec):
        if not _same(getattr(read, name), getattr(spec, name)):
            raise SplitformerError(f"{where}: {name}: not what its network file would hold")
    return spec


def _options(operator: object, where: str) -> dict:
    """An operator object's options (its fields besides ``key``), refused if it carries anything else."""
    if not isinstance(operator, Operator) or type(operator) is not OPERATOR_KINDS.get(getattr(type(operator), "kind", None)):
        raise SplitformerError(f"{where}: expected a registered operator, got {type(operator).__name__}")
    names = [item.name for item in fields(operator)]
    if set(vars(operator)) != set(names):
        raise SplitformerError(f"{where}: operator {operator.key!r} carries attributes besides its fields")
    return {name: getattr(operator, name) for name in names if name != "key"}


def _same(read: object, given: object) -> bool:
    """Whether ``given`` is ``read`` with the same types all the way down (``==`` alone trusts subclasses)."""
    if type(read) is not type(given):
        return False
    if isinstance(read, dict):
        return list(read) == list(given) and all(type(key) is str and _same(read[key], given[key]) for key in read)
    if isinstance(read, tuple):
        return len(read) == len(given) and all(_same(a, b) for a, b in zip(read, given))
    if isinstance(read, Operator):
        return set(vars(read)) == set(vars(given)) and all(_same(vars(read)[name], vars(given)[name]) for name in vars(read))
    return read is given or read == given


def _beside(scheme: str, folder: Path | None) -> str:
    """A scheme file named by a network file is read beside it (a name that is no file there, a built-in's or a
    mistyped one, stays a name: the error names what the file says)."""
    if folder is None or scheme in builtin_names() or Path(scheme).is_absolute():
        return scheme
    beside = folder / scheme
    return str(beside) if beside.exists() or scheme.endswith(".toml") or "/" in scheme else scheme


def portable_text(text: str, path: Path) -> str:
    """A network file's ``text`` (read from ``path``) whose ``[steps] scheme`` names a file beside it, naming that file
    by its absolute path, so that a copy of the text elsewhere reads the same scheme (``show --format toml``: a text
    to copy and change); any other text as it is."""
    try:
        steps = tomllib.loads(text.removeprefix("\ufeff")).get("steps")
    except tomllib.TOMLDecodeError:
        return text
    scheme = steps.get("scheme") if isinstance(steps, dict) else None
    if not isinstance(scheme, str) or (found := _beside(scheme, path.parent)) == scheme or not Path(found).is_file():
        return text
    absolute = toml_value(str(Path(found).resolve()), "steps.scheme")
    return re.sub(rf"""(?m)^(\s*scheme\s*=\s*)(["']){re.escape(scheme)}\2""", lambda m: m.group(1) + absolute, text,
                  count=1)


def load_network(name_or_path: str | os.PathLike) -> NetworkSpec:
    """A built-in network by name, or a network file by path."""
    name_or_path = os.fspath(name_or_path)
    if is_network(name_or_path):
        return parse_network(network_text(name_or_path), f"built-in network {name_or_path!r}")
    return parse_network(read_source(Path(name_or_path), "network file"), name_or_path, Path(name_or_path).parent)


def is_network_file(text: str) -> bool:
    """Whether a TOML text is a network file (an ``embedding`` or ``readout``, a grid ``step`` or a
    ``composition``) rather than a block scheme; unreadable TOML is neither (``False``)."""
    try:
        document = tomllib.loads(text.removeprefix("\ufeff"))
    except (ValueError, RecursionError):
        return False
    return bool(NETWORK_FIELDS & set(document))


def load_scheme_or_network(name_or_path: str | os.PathLike) -> Scheme | NetworkSpec:
    """A built-in scheme or network by name, or a scheme or network file by path (read once)."""
    if isinstance(name_or_path, (str, os.PathLike)) and is_network(os.fspath(name_or_path)):
        return load_network(name_or_path)
    path = scheme_path(name_or_path)
    if path is None:
        return load_scheme(name_or_path)
    text = read_source(path, "scheme or network file")
    return parse_network(text, str(path), path.parent) if is_network_file(text) else parse_scheme(text, str(path))


def _composition(spec: NetworkSpec) -> tuple:
    """What a network computes, without its name and summary (a grid network's operators by kind and options)."""
    if isinstance(spec, GridNetworkSpec):
        operators = tuple((key, operator.kind, repr(operator)) for key, operator in spec.operators.items())
        return ("grid", operators, spec.field, spec.transfer, spec.projection)
    if isinstance(spec, MultiscaleSpec):
        return ("multiscale",)
    return ("tokens", spec.embedding.kind, spec.readout.kind)


def network_derive_argument(spec: NetworkSpec) -> str:
    """What ``splitformer derive`` takes to emit ``spec``'s module: its name where it is the built-in of that name
    (same computation), else NETWORK_FILE (its file, which the spec does not know)."""
    builtin = is_network(spec.name) and network_fingerprint(load_network(spec.name)) == network_fingerprint(spec)
    return spec.name if builtin else "NETWORK_FILE"


def network_fingerprint(spec: NetworkSpec) -> str:
    """A digest of what a network computes: its operators with their names and options, its composition,
    and a token network's steps (the scheme's ``fingerprint``) and final norm; not its name or summary.
    Emitted network modules carry it (``COMPUTES``); adapters compare it."""
    if isinstance(spec, TokenNetworkSpec):
        computation = ("tokens", repr(spec.embedding), spec.scheme.fingerprint, spec.final_norm, repr(spec.readout))
    elif isinstance(spec, MultiscaleSpec):
        computation = ("multiscale", sorted((table, sorted(kinds.items())) for table, kinds in MULTISCALE.items()))
    else:
        computation = _composition(spec)
    return hashlib.sha256(repr(computation).encode()).hexdigest()[:16]


def network_family(spec: NetworkSpec) -> str | None:
    """The built-in network whose composition ``spec`` shares (its scheme may differ), or ``None``:
    the evaluators and sizes of the network checks are written per family."""
    return next((name for name in network_names() if _composition(load_network(name)) == _composition(spec)), None)

"""Splitting schemes as data: operators, options and the composition of their substeps
(``composition``: sequences, parallel branches, Runge–Kutta steps, re-exported here)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import MISSING, dataclass, field, fields, replace

from sympy.core.cache import clear_cache

from .across_layers import AcrossLayers
from .activations import activation as lookup_activation
from .composition import STEP_CONTROLS, Heun, Parallel, RungeKutta, Sequence, Substep
from .domains import FEATURES, Y
from .equation import equation_latex
from .errors import SplitformerError
from .markdown import code_block, inert, markdown_text
from .names import check_scheme_name
from .operator_checks import check_constraints, check_declared, check_output, check_symbols
from .kinds import OPERATOR_KINDS
from .operators import SUPPORT, Definition, Operator, Parameter, kernel
from .scheme_fields import check_fields

__all__ = ["Substep", "Parallel", "RungeKutta", "Heun", "Sequence", "Scheme", "SOLVERS", "MAX_EVALUATIONS",
           "STEP_CONTROLS", "operator_options", "step_control", "checked_activation"]

#: How a substep is solved over its share of the step (``explicit`` is the Euler tableau).
SOLVERS = {
    "explicit": "explicit Euler",
    "projection": "projection (implicit Euler of a normal cone)",
}


def operator_options(cls: type[Operator]) -> dict[str, object]:
    """The options an operator kind takes (its dataclass fields after ``key``) and their defaults."""
    return {f.name: f.default for f in fields(cls) if f.name != "key"}


#: Operators that passed ``_checked``, by kind class, key and options (``_typed``): operators are frozen, and a
#: scheme is instantiated again at every stage of a derivation, a check and a rendering (each time building every
#: definition and checking it). A class loaded again (``--load``) is another key.
_CHECKED: dict[tuple, Operator] = {}
_CHECKED_AT_MOST = 4096


def _typed(value: object) -> object:
    """``value`` with the type of every part beside it: options 1 and 1.0 (or True), equal in Python, build
    different operators, as do 0.0 and -0.0. A set (whose equal members merge) raises TypeError: no memo."""
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_typed(item) for item in value)
    if isinstance(value, dict):
        return type(value), tuple((_typed(name), _typed(item)) for name, item in value.items())
    if isinstance(value, (set, frozenset)):
        raise TypeError("a set")
    if isinstance(value, float):
        return type(value), value, math.copysign(1.0, value)
    return type(value), value


def _checked(cls: type[Operator], key: str, options: dict, where: str) -> Operator:
    """Build an operator and call its protocol methods once, so a faulty kind (a user's,
    loaded with ``--load``) fails here in one ``SplitformerError`` line, not deep in a derivation."""
    try:
        memo = (cls, key, _typed(options))
        return _CHECKED[memo]
    except KeyError:
        pass
    except TypeError:  # an unhashable option (or a set): built and checked each time
        memo = None
    try:
        operator = cls(key, **options)
        parameters, definitions = operator.parameters(), operator.definitions()
        constants, inputs = operator.constants, operator.input_fields
    except SplitformerError:
        raise
    except (Exception, SystemExit) as error:  # a user's code: any failure (sys.exit too) is reported in one line  # noqa: BLE001
        raise SplitformerError(f"{where}: {type(error).__name__}: {error}") from None
    for method, result, item in (("parameters", parameters, Parameter), ("definitions", definitions, Definition)):
        wrong = [entry for entry in result if not isinstance(entry, item)] if isinstance(result, (tuple, list)) else [result]
        if wrong:
            raise SplitformerError(f"{where}: {method}() must return a tuple of {item.__name__}, "
                                   f"got {type(wrong[0]).__name__} {str(wrong[0])[:60]!r}")
    if not definitions:
        raise SplitformerError(f"{where}: definitions() is empty; an operator defines at least its output")
    try:
        check_declared(constants, inputs, where)
        check_output(tuple(parameters), tuple(definitions), where, combiner=operator.is_combiner is True,
                     constants=constants, inputs=inputs)
        if operator.reads_input(SUPPORT) and not operator.uses_support():
            raise SplitformerError(f"{where}: its definitions read the support χ, but its uses_support() says False "
                                   "(leave it out: it is read from the definitions)")
        check_symbols(cls, where)
        if operator.is_projection and hasattr(cls, "constraints"):  # a ProjectionOperator: its set is printed too
            check_constraints(cls.constraints, where)
    except SplitformerError:
        clear_cache()  # a refused symbol (a str-subclass name) equals the library's own: SymPy's cache would hand it out
        raise
    if memo is not None:
        if len(_CHECKED) >= _CHECKED_AT_MOST:  # plug-ins loaded again and again keep no class alive for ever
            _CHECKED.clear()
        _CHECKED[memo] = operator
    return operator


def checked_activation(name: object) -> str:
    """``name`` when it names an activation (``SplitformerError`` otherwise)."""
    if not isinstance(name, str):
        raise SplitformerError(f"activation: expected a name (str), got {type(name).__name__}")
    lookup_activation(name)
    return name


def step_control(step: str) -> Parameter:
    """The learned time step of a substep's field, stored under ``<operator>.step``: ``λ(y)``, shape ``(d,)``
    (``Substep.step = "per-channel"``: LayerScale) or one number ``λ``, shape ``()`` (``"scalar"``: ReZero);
    zero-initialized in a generated Block (LayerScale's and ReZero's start)."""
    if step == "per-channel":
        return kernel("step", r"\lambda", (Y,), (FEATURES,))
    if step == "scalar":
        return kernel("step", r"\lambda", (), ())
    raise SplitformerError(f"unknown step {step!r} (known: {', '.join(STEP_CONTROLS)})")


#: The most operator evaluations one step may make: a bound on the derivation's time.
MAX_EVALUATIONS = 64


@dataclass(frozen=True, eq=False)
class Scheme:
    """A named splitting scheme over named operators."""

    name: str
    summary: str
    operators: dict[str, str]
    body: Sequence
    activation: str = "relu"
    final_norm: bool = False
    description: str = ""
    #: Claimed orders (``order``, ``splitting_order``), checked by ``splitformer check``.
    claims: dict[str, int] = field(default_factory=dict)
    source: str = field(default="", compare=False)
    #: The activation the scheme file declares (``gelu-tanh`` for gpt2); another one is
    #: appended to the module name.
    declared_activation: str = "relu"
    #: The self-attention's token integral is restricted to ``x̃ ≤ x`` unless the caller
    #: says otherwise (the default of the emitted ``causal`` argument).
    causal: bool = False
    #: With a padding mask, a padded token lies outside Ω_x as a query too (x-transformers, which zeroes
    #: its attention rows): its row of the support χ(x, x̃) is zero. False: it is only no key (torch).
    padded_queries_outside: bool = False
    #: Options of the operators by key (``{"ffn": {"bias": False}}``); see ``operator_options``.
    options: dict[str, dict] = field(default_factory=dict)
    #: ``as_causal`` made the scheme causal (its file did not say ``causal = true``).
    made_causal: bool = False
    #: The name ``with_name`` gave its module and report (a scheme name); empty: from ``name``.
    emitted_name: str = ""
    #: How a stack combines its layers (a multistep method or a momentum; ``across_layers``); ``None``:
    #: each layer maps the state to the next one.
    across_layers: AcrossLayers | None = None

    @property
    def module_name(self) -> str:
        """``post-ln`` → ``post_ln``; an activation other than the declared one is appended
        (``pre_ln_gelu``), then ``_causal`` when ``as_causal`` made it causal; ``with_name``'s
        name replaces all of it."""
        if self.emitted_name:
            return self.emitted_name.replace("-", "_")
        base = self.name.replace("-", "_")
        if self.activation != self.declared_activation:
            base += "_" + self.activation.replace("-", "_")
        return base + "_causal" if self.made_causal else base

    @property
    def derive_arguments(self) -> str:
        """The arguments of ``splitformer derive`` that emit this module (the scheme's name, options)."""
        words = [self.name]
        if self.activation != self.declared_activation:
            words += ["--activation", self.activation]
        if self.made_causal:
            words.append("--causal")
        if self.emitted_name:
            words += ["--name", self.emitted_name]
        return " ".join(words)

    @property
    def fingerprint(self) -> str:
        """A digest of what one step computes: the operators with their options, the composition
        of substeps, the activation, the final norm and causality (not the name, summary or
        claims). Emitted torch modules carry it (``COMPUTES``); adapters compare it."""
        computation = (sorted(self.operators.items()), self.body, self.activation, self.final_norm, self.causal,
                       sorted((key, sorted(options.items())) for key, options in self.options.items()))
        if self.padded_queries_outside:  # schemes without it keep their fingerprints
            computation += ("padded_queries_outside",)
        if self.across_layers is not None:  # one-state schemes keep their fingerprints
            computation += (self.across_layers.key,)
        if self.streams:
            computation += (("stream", tuple(step.stream for step in self.substeps())),)
        return hashlib.sha256(repr(computation).encode()).hexdigest()[:16]

    def activated(self) -> dict[str, bool]:
        """The operators of an activated kind, each with whether it takes the scheme's activation (its options name
        none of its own)."""
        return {key: "activation" not in self.options.get(key, {}) for key, kind in self.operators.items()
                if kind in OPERATOR_KINDS and "activation" in operator_options(OPERATOR_KINDS[kind])}

    def reads_activation(self) -> bool:
        """Whether an operator takes the scheme's activation."""
        return any(self.activated().values())

    def with_activation(self, name: str) -> "Scheme":
        """The scheme with ``name`` as the activation of every operator that takes the scheme's; refused when none
        does (each names its own), since the module would be named for an activation it does not compute."""
        checked_activation(name)
        if name != self.activation and not self.reads_activation():
            why = "each activated operator names its own in its options" if self.activated() else \
                "it has no activated operator"
            raise SplitformerError(f"activation {name!r}: no operator of scheme {self.name!r} takes the scheme's "
                                   f"activation ({why})")
        return replace(self, activation=name)

    def as_causal(self) -> "Scheme":
        """The scheme with causal self-attention, as a file saying ``causal = true`` makes it: a
        KV cache in the emitted modules and ``causal=True`` by default."""
        if self.causal:
            return self
        causal = replace(self, causal=True, made_causal=True)
        if self.across_layers is not None or self.streams:  # refused, as in a file
            causal._check_across_layers(self.instantiate())
            causal._check_stream(self.instantiate())
        return causal

    def with_name(self, name: str) -> "Scheme":
        """The scheme emitted as ``name``: its module and report are ``name`` with ``-`` as ``_``."""
        if not isinstance(name, str):
            raise SplitformerError(f"a module name must be a string, got {type(name).__name__}")
        return replace(self, emitted_name=check_scheme_name(name))

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {equation_latex(self)}$"

    def _repr_markdown_(self) -> str:
        claims = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in self.claims.items())
        lines = [f"**`{self.name}`**: {markdown_text(self.summary)}", "", f"$$ {equation_latex(self)} $$", "",
                 f"activation `{self.activation}`" + (", final LayerNorm" if self.final_norm else "")
                 + (f"; claims {claims}" if claims else ""), ""]
        inert("\n".join(lines), f"the view of {self.name!r}")  # the source below is code: shown as it is
        if self.source:
            lines.append(code_block(self.source.rstrip("\n")))
        return "\n".join(lines)

    def instantiate(self) -> dict[str, Operator]:
        """The operator objects, keyed by their names in the scheme."""
        result: dict[str, Operator] = {}
        for key, kind in self.operators.items():
            if kind not in OPERATOR_KINDS:
                known = ", ".join(sorted(OPERATOR_KINDS))
                raise SplitformerError(f"scheme {self.name!r}: unknown operator kind {kind!r} for {key!r} (known: {known})")
            cls = OPERATOR_KINDS[kind]
            options = dict(self.options.get(key, {}))
            allowed = operator_options(cls)
            unknown = sorted(set(options) - set(allowed))
            if unknown:
                raise SplitformerError(f"scheme {self.name!r}: operator {key!r} ({kind}) has no option {unknown[0]!r} "
                                       f"(options: {', '.join(allowed) or 'none'})")
            if "activation" in allowed:
                options["activation"] = lookup_activation(options.get("activation", self.activation))
            required = [name for name, default in allowed.items() if default is MISSING and name not in options]
            if required:
                raise SplitformerError(f"scheme {self.name!r}: operator {key!r} ({kind}) needs the option {required[0]!r}")
            result[key] = _checked(cls, key, options, f"scheme {self.name!r}: operator {key!r} ({kind})")
        return result

    def places_tokens(self) -> bool:
        """Whether the tokens' positions reach what a step computes (``Operator.places_tokens``): a language model
        around it adds no learned positions (``splitformer.nn``; emitted as ``PLACES_TOKENS``)."""
        return any(operator.places_tokens() for operator in self.instantiate().values())

    def substeps(self) -> list[Substep]:
        """All substeps, depth first."""
        found: list[Substep] = []

        def visit(sequence: Sequence) -> None:
            for step in sequence.steps:
                if isinstance(step, Parallel):
                    for branch in step.branches:
                        visit(branch)
                elif isinstance(step, RungeKutta):
                    found.extend(step.fields)
                else:
                    found.append(step)

        visit(self.body)
        return found

    @property
    def streams(self) -> bool:
        """Whether some substep adds its increment to the second state ``d`` (``Substep.stream``): a stack
        then carries ``(u, d)`` from ``d⁰ = u⁰`` and reads out ``u + P(d)``, ``P`` its final projection."""
        return any(step.stream for step in self.substeps())

    def step_controls(self) -> dict[str, Parameter]:
        """The learned time steps by operator key: the field of ``<operator>`` carries ``<operator>.step``
        (shared by every substep of that field)."""
        return {substep.operator: step_control(substep.step) for substep in self.substeps() if substep.step != "fixed"}

    def evaluations(self) -> int:
        """How many operator evaluations one step makes (a Runge–Kutta field counts once per stage)."""

        def count(sequence: Sequence) -> int:
            return sum(sum(map(count, step.branches)) if isinstance(step, Parallel)
                       else len(step.fields) * step.tableau.stages if isinstance(step, RungeKutta) else 1
                       for step in sequence.steps)

        return count(self.body)

    def _check_combiner(self, step: Substep, operators: dict[str, Operator]) -> None:
        """A combiner is named by ``combine`` only, on a field with a fixed step (``λ`` would scale
        the branch before the gate: not in the language yet)."""
        if operators[step.operator].is_combiner:
            raise SplitformerError(f"scheme {self.name!r}: {step.operator!r} is a residual combiner; name it in a "
                                   "substep's 'combine', not as its operator")
        if step.combine is None:
            return
        if not operators[step.combine].is_combiner:
            raise SplitformerError(f"scheme {self.name!r}: 'combine' must name a residual combiner (a kind such as "
                                   f"'gru-gate'), not {step.combine!r}")
        if step.solver == "projection" or step.step != "fixed":
            raise SplitformerError(f"scheme {self.name!r}: the combined field {step.operator!r} takes no projection "
                                   "solver and no learned 'step'")

    def _check_token_map(self, step: Substep, operators: dict[str, Operator]) -> None:
        """A token map (token shift) is named by ``shift`` only, on a vector field."""
        if getattr(operators[step.operator], "is_token_map", False):
            raise SplitformerError(f"scheme {self.name!r}: {step.operator!r} is a token map; name it in a "
                                   "substep's 'shift', not as its operator")
        if step.shift is None:
            return
        if not getattr(operators[step.shift], "is_token_map", False):
            raise SplitformerError(f"scheme {self.name!r}: 'shift' must name a token map (a kind such as "
                                   f"'token-shift'), not {step.shift!r}")
        if step.solver == "projection":
            raise SplitformerError(f"scheme {self.name!r}: the projection {step.operator!r} takes no 'shift'")

    def check(self) -> None:
        """Raise ``SplitformerError`` where a field is of the wrong type or holds bad text
        (``scheme_fields``), or where operators and solvers do not fit."""
        check_fields(self)
        operators = self.instantiate()
        if not self.substeps():
            raise SplitformerError(f"scheme {self.name!r} applies no operator: every branch is empty (the identity)")
        if self.evaluations() > MAX_EVALUATIONS:
            raise SplitformerError(f"scheme {self.name!r} evaluates {self.evaluations()} operators per step; at most "
                                   f"{MAX_EVALUATIONS} are supported (each adds to the derivation time)")
        for step in self.substeps():
            if step.solver not in SOLVERS:
                raise SplitformerError(f"scheme {self.name!r}: unknown solver {step.solver!r} "
                                       f"(known: {', '.join(SOLVERS)})")
            for key in (step.operator, step.on, step.then, step.combine, step.shift):
                if key is not None and key not in operators:
                    raise SplitformerError(f"scheme {self.name!r}: substep names unknown operator {key!r}")
            operator = operators[step.operator]
            if step.solver == "projection" and not operator.is_projection:
                raise SplitformerError(
                    f"scheme {self.name!r}: {step.operator!r} is a vector field, not a projection; "
                    "solve it with 'explicit'")
            if step.solver == "explicit" and operator.is_projection:
                raise SplitformerError(
                    f"scheme {self.name!r}: {step.operator!r} is a projection and cannot be used as a "
                    "vector field; solve it with 'projection'")
            for role in ("on", "then"):
                key = getattr(step, role)
                if key is not None and not operators[key].is_projection:
                    raise SplitformerError(f"scheme {self.name!r}: {role!r} must name a projection, not {key!r}")
            self._check_combiner(step, operators)
            self._check_token_map(step, operators)
            if step.step not in STEP_CONTROLS:
                raise SplitformerError(f"scheme {self.name!r}: unknown step {step.step!r} (known: {', '.join(STEP_CONTROLS)})")
            if step.solver == "projection" and (step.then is not None or step.step != "fixed"):
                raise SplitformerError(f"scheme {self.name!r}: the projection {step.operator!r} takes no 'then' or "
                                       "learned 'step' (the normal cone absorbs Δt)")
        steps = {}
        for step in self.substeps():
            if step.solver != "projection" and steps.setdefault(step.operator, step.step) != step.step:
                raise SplitformerError(f"scheme {self.name!r}: the field {step.operator!r} has steps {steps[step.operator]!r} "
                                       f"and {step.step!r}; its learned step {step.operator}.step is one control")
        self._check_across_layers(operators)
        self.head_width(operators)
        self._check_stream(operators)
        self._check_constants(operators)
        used = {key for step in self.substeps() for key in (step.operator, step.on, step.then, step.combine, step.shift)
                if key is not None}
        unused = [key for key in operators if key not in used]
        if unused:
            raise SplitformerError(f"scheme {self.name!r}: operator {unused[0]!r} is declared but no step uses it "
                                   "(its parameters would be required for nothing); remove it or use it")

    def _check_constants(self, operators: dict[str, Operator]) -> None:
        """Operators declaring a constant of one name agree on its symbol and default: the emitted code has one
        keyword argument of that name (the proof checks run it at the first declaration's ``check_value``)."""
        declared: dict[str, tuple[str, object]] = {}
        for key, operator in operators.items():
            for constant in operator.constants:
                first_key, first = declared.setdefault(constant.name, (key, constant))
                if (first.symbol, first.default) != (constant.symbol, constant.default):
                    raise SplitformerError(
                        f"scheme {self.name!r}: operators {first_key!r} and {key!r} declare the constant "
                        f"{constant.name!r} differently (defaults {first.default:g} and {constant.default:g}, or the "
                        "symbols' assumptions); the emitted code has one argument of that name")

    def head_width(self, operators: dict[str, Operator] | None = None) -> int | None:
        """The head width ``d_head`` its attention operators set, ``None`` for ``d / n_heads``; the emitted
        code has one head width, so every operator with the option must give the same one."""
        operators = self.instantiate() if operators is None else operators
        widths = {key: operator.d_head for key, operator in operators.items()
                  if "d_head" in operator_options(type(operator))}
        (first, width), *others = widths.items() or [(None, None)]
        for other, different in others:
            if different != width:
                raise SplitformerError(f"scheme {self.name!r}: operators {first!r} and {other!r} set d_head = {width} "
                                       f"and {different} (None: d / n_heads); the emitted code has one head width")
        return width

    def _check_stream(self, operators: dict[str, Operator]) -> None:
        """A stream substep is an explicit substep of the top-level sequence (its increment is one term of the
        second state's update); the stack carrying the second state has no cache, memory or positions."""
        if not self.streams:
            return
        top = [step for step in self.body.steps if isinstance(step, Substep)]
        for step in self.substeps():
            if step.stream and (step.solver != "explicit" or not any(step is own for own in top)):
                raise SplitformerError(f"scheme {self.name!r}: 'stream' marks an explicit substep of the top-level "
                                       f"sequence (not a projection, a parallel branch or a Runge–Kutta field): "
                                       f"{step.operator!r}")
        if self.across_layers is not None:
            raise SplitformerError(f"scheme {self.name!r}: a second stream is not supported with across_layers "
                                   "(a stack carries one second state)")
        self._check_one_carried_state("a second stream", operators)

    def _check_one_carried_state(self, what: str, operators: dict[str, Operator]) -> None:
        """A stack that carries a second state (``what``) carries nothing else: no cache, memory or positions."""
        if self.causal:
            raise SplitformerError(f"scheme {self.name!r}: {what} is not supported with causal = true "
                                   "(the KV cache carries one state per layer)")
        for key, operator in operators.items():
            if operator.input_fields:
                raise SplitformerError(f"scheme {self.name!r}: {what} is not supported with {key!r}, which "
                                       f"reads {', '.join(sorted(field.name for field in operator.input_fields))}")

    def _check_across_layers(self, operators: dict[str, Operator]) -> None:
        """A scheme combined across layers steps by one explicit Euler evaluation of its field (so a layer's
        increment is ``Δt G``), with no projection after it and no cache, memory or positions to carry."""
        if self.across_layers is None:
            return
        if not isinstance(self.across_layers, AcrossLayers):
            raise SplitformerError(f"scheme {self.name!r}: across_layers: expected AcrossLayers, "
                                   f"got {type(self.across_layers).__name__}")
        steps = self.body.steps
        single = len(steps) == 1 and (isinstance(steps[0], Substep) and steps[0].solver == "explicit"
                                      or isinstance(steps[0], RungeKutta) and steps[0].tableau.stages == 1)
        if not single or any(step.then is not None for step in self.substeps()):
            raise SplitformerError(f"scheme {self.name!r}: across_layers needs a step that is one explicit Euler "
                                   "evaluation of the field (one explicit substep, or one rk = \"euler\" step of "
                                   "summed fields, without 'then'): the layer's increment is then Δt G")
        self._check_one_carried_state("across_layers", operators)
        if "splitting_order" in self.claims:
            raise SplitformerError(f"scheme {self.name!r}: across_layers: claim 'order' (of the method across layers), "
                                   "not 'splitting_order'")

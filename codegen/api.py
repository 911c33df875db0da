"""The Python API of a derivation: one scheme in, everything the pipeline makes out.

``derive(scheme)`` returns a ``Derivation`` holding the discrete program, its substep
records, the order result and the derivation report; ``numpy_module()`` and
``torch_module()`` give the generated modules in memory (the same API as the files),
``write(out)`` writes the files ``splitformer derive`` writes. Every object a notebook
displays has a ``_repr_latex_`` or ``_repr_markdown_``::

    import splitformer

    derivation = splitformer.derive("pre-ln", activation="gelu")
    derivation.records[0]            # one substep: time rule and assignments (LaTeX)
    block = derivation.torch_module().Block(16, 4, 40)
"""

from __future__ import annotations


import hashlib
import types
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field, fields
from functools import cached_property
from pathlib import Path

from splitformer.codegen.verification.statements.order import OrderResult, splitting_order
from splitformer.symbolic.derivation import derive as derive_program
from splitformer.symbolic.equation import Equation, scheme_equation
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.markdown import inert, markdown_text
from splitformer.symbolic.plugins import plugin_failures
from splitformer.symbolic.program import Program, SubstepRecord
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.network_spec import GridNetworkSpec, TokenNetworkSpec, MultiscaleSpec, load_scheme_or_network
from splitformer.symbolic.scheme_file import load_scheme

from .ir import Module
from .derivations import GeneratedModules, check_passes, check_write_options
from .network_api import NetworkDerivation
from .output import PLOTS_HINT, as_folder, check_replaceable, check_writable, write_files
from .passes import select
from .pipeline import BACKEND_CHOICES, generate, lower_backward, lower_scheme
from .render import render_module
from .report import render_report

__all__ = ["Derivation", "NetworkDerivation", "derive", "as_scheme"]


def as_scheme(scheme: Scheme | str, activation: str | None = None) -> Scheme:
    """A ``Scheme`` from itself, a built-in name or a scheme-file path, checked."""
    if isinstance(scheme, (str, Path)):
        scheme = load_scheme(scheme)
    elif not isinstance(scheme, Scheme):
        raise SplitformerError(f"expected a Scheme, a built-in name or a scheme file, got {type(scheme).__name__}")
    if activation is not None and not isinstance(activation, str):
        raise SplitformerError(f"activation: expected a name (str) or None, got {type(activation).__name__}")
    scheme.check()  # one path for every scheme: a file's, a Python object's, a plug-in's
    return scheme if activation is None else scheme.with_activation(activation)


@dataclass
class Derivation(GeneratedModules):
    """A derived scheme: program, records, orders, report, and the generated code."""

    scheme: Scheme
    program: Program
    passes: tuple | None = None
    SEALED = ("scheme", "program", "passes")
    #: Set by ``derive``, which made ``program`` from ``scheme`` itself (a hand-made one is derived again).
    _derived: InitVar[bool] = False
    _modules: dict[str, types.ModuleType] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self, _derived: bool) -> None:
        """A ``Derivation`` made by hand is checked like one ``derive`` makes: its scheme, and a
        program equal to what ``derive`` makes of it (the program's names and expressions become code)."""
        if not isinstance(self.scheme, Scheme):
            raise SplitformerError(f"Derivation: scheme: expected a Scheme, got {type(self.scheme).__name__}")
        if not isinstance(self.program, Program):
            raise SplitformerError(f"Derivation: program: expected a Program, got {type(self.program).__name__}")
        self.scheme.check()
        check_passes(self.passes, "Derivation")
        if self.program.name != self.scheme.module_name:
            raise SplitformerError(f"Derivation: the program {self.program.name[:64]!r} is not derived from the scheme "
                                   f"{self.scheme.name!r} (use splitformer.derive)")
        if _derived is not True:
            with plugin_failures(self.scheme):
                derived = derive_program(self.scheme)
            if self.program != derived:
                raise SplitformerError(f"Derivation: the program differs from what the scheme {self.scheme.name!r} "
                                       "derives (use splitformer.derive)")
        self._seal()

    def _state(self) -> bytes:
        """A digest of the fields the derivation was checked on (the program's own ``repr`` is a summary: its fields)."""
        program = {item.name: getattr(self.program, item.name) for item in fields(self.program)}
        return hashlib.sha256(repr([self.scheme, program, self.passes]).encode()).digest()

    @property
    def title(self) -> str:
        """The scheme's name (``pre-ln``)."""
        return self.scheme.name

    @property
    def name(self) -> str:
        """The module name of the generated code (``pre_ln_gelu``)."""
        return self.program.name

    @property
    def records(self) -> list[SubstepRecord]:
        """One record per substep: its time rule and the assignments it produced."""
        return self.program.records

    @property
    def equation(self) -> Equation:
        """The continuous equation of the scheme and its operator splitting."""
        self._unchanged()
        return scheme_equation(self.scheme)

    @property
    def order(self) -> OrderResult:
        """Orders and leading local-error terms of one step (non-commutative series)."""
        self._unchanged()
        return self._order

    @cached_property
    def _order(self) -> OrderResult:
        return splitting_order(self.scheme)

    @cached_property
    def report(self) -> str:
        """The derivation report (Markdown), as ``splitformer derive`` writes it."""
        self._unchanged()
        return render_report(self.scheme, self.program, adjoint=self.backward[0].symbolic, order=self.order)

    @cached_property
    def lowered(self) -> tuple[Module, Module]:
        """The tensor IR of the block and of a stack's final norm."""
        self._unchanged()
        return lower_scheme(self.scheme, self.program, self.passes)

    @cached_property
    def backward(self):
        """The lowered derived adjoints of the block and of a stack's final norm (``vjp``, ``backward="derived"``)."""
        self._unchanged()
        return lower_backward(self.scheme, self.program, self.passes)

    def _source(self, backend: str) -> str:
        with plugin_failures(self.scheme):
            block, final_norm = self.lowered
            return render_module(self.scheme, block, final_norm, backend, *self.backward)

    def write(self, out: str | Path = "generated", backend: str = "all", force: bool = False) -> list[Path]:
        """Write the modules and the report under ``out`` (all or nothing); returns the paths.

        ``force`` overwrites modules and reports that splitformer did not write (``splitformer
        derive --force``); a package ``__init__.py`` of your own is always kept.
        """
        check_write_options(backend, force)
        self._unchanged()
        out = as_folder(out, "out")
        with plugin_failures(self.scheme):
            files = generate(self.scheme, BACKEND_CHOICES[backend], out, self.passes, self.program, self.lowered)
        write_files(files, force=force, root=out)
        return list(files)

    def check(self, plots: str | Path | None = None, only: str | Iterable[str] | None = None):
        """This scheme's checks (semantics, recovery, adjoint, order, convergence, …) as a ``CheckReport``;
        ``only`` names the groups to run (``"order,convergence"``; ``splitformer check --only``)."""
        from .verification.groups import check_groups, require_checks
        from .verification.runner import scheme_checks

        only = check_groups(only)
        if only == {"general"}:
            raise SplitformerError("only: the general statements hold for every scheme and run with splitformer check; "
                                   "a derivation's check runs its scheme's own groups")
        if plots is not None and "convergence" not in only:
            raise SplitformerError("plots: the plots are the convergence study's; add 'convergence' to only")
        if plots is not None:  # refused before the checks run, not after
            plots = as_folder(plots, "plots")
            check_replaceable(plots / f"{self.scheme.module_name}_convergence.png", hint=PLOTS_HINT)
            check_writable(plots, f"plots={str(plots)!r}")
        self._unchanged()
        return require_checks(scheme_checks(self.scheme, self.program, plots, only=only), only, [self.scheme.name])

    def __repr__(self) -> str:
        return f"<Derivation of {self.scheme.name!r} → {self.name}: {len(self.records)} substeps>"

    def _repr_markdown_(self) -> str:
        order = self.order
        orders = (f"no local error term up to h^{order.checked_nodes}" if order.order is None else
                  f"order {order.order}" + ("" if order.splitting_order is None
                                            else f", splitting order {order.splitting_order}")
                  + f"; leading local error ${order.leading_error}$")
        lines = [f"**Derivation of `{self.scheme.name}`** → `{self.name}`: {markdown_text(self.scheme.summary)}", "",
                 f"$$ {self.equation.latex} $$", "", orders, "", f"{len(self.records)} substeps:", ""]
        lines += [f"{position}. {record.title.split(': ', 1)[-1]}" for position, record in enumerate(self.records, 1)]
        return inert("\n".join(lines), f"the view of {self.scheme.name!r}")


def derive(scheme: Scheme | str, activation: str | None = None, passes: str | tuple | None = None, *,
           causal: bool = False, name: str | None = None) -> Derivation | NetworkDerivation:
    """Derive ``scheme`` (a ``Scheme``, built-in name or scheme file) into a ``Derivation``;
    a network (a built-in network's name or a network file) into a ``NetworkDerivation``.

    ``passes``: the IR passes of the emitted code, ``"all"`` (default), ``"none"`` or
    comma-separated names as for ``splitformer derive --passes``. ``causal``: causal
    self-attention with a KV cache (``derive --causal``); ``name``: the module and report
    name (``derive --name``).
    """
    if not isinstance(causal, bool):
        raise SplitformerError(f"causal must be True or False, got {type(causal).__name__}")
    if passes is not None and not isinstance(passes, (str, tuple)):
        raise SplitformerError(f"passes: expected 'all', 'none', comma-separated names or a tuple of passes, "
                               f"got {type(passes).__name__}")
    if isinstance(passes, tuple) and not all(callable(rewrite) for rewrite in passes):
        raise SplitformerError("passes: a tuple of passes holds the passes themselves (functions); "
                               "name them in a string instead ('matmul,layer-norm')")
    if isinstance(scheme, (str, Path)):
        scheme = load_scheme_or_network(scheme)
    if isinstance(scheme, (TokenNetworkSpec, GridNetworkSpec, MultiscaleSpec)):
        given = [option for option, value in (("activation", activation), ("causal", causal or None), ("name", name))
                 if value is not None]
        if given:
            raise SplitformerError(f"{given[0]} applies to schemes, not to the network {scheme.name!r} (it names its own)")
        return NetworkDerivation(scheme, select(passes) if isinstance(passes, str) else passes)
    scheme = as_scheme(scheme, activation)
    scheme = scheme.as_causal() if causal else scheme
    scheme = scheme if name is None else scheme.with_name(name)
    with plugin_failures(scheme):
        program = derive_program(scheme)
    return Derivation(scheme, program, select(passes) if isinstance(passes, str) else passes, _derived=True)

"""``splitformer check``: run every check that applies and format the results.

General checks (projections, the subdifferential sign, activations) run once; per scheme:
the derived and emitted program against the independent evaluator (``verification``),
exact recovery (when the scheme is a built-in with a published reference), the splitting order by non-commutative
series against the orders the scheme file claims, and the numeric convergence study.
"""

from __future__ import annotations

import functools
import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from splitformer.codegen.verification.statements import SKIPPED, Check
from splitformer.codegen.verification.statements.activations import activation_checks
from splitformer.codegen.verification.statements.llm import llm_checks
from splitformer.codegen.verification.statements.network_recovery import network_statement_checks
from splitformer.codegen.verification.statements.adjoint import adjoint_checks, general_adjoint_checks
from splitformer.codegen.verification.statements.order import PROJECTIONS, OrderResult, splitting_order
from splitformer.codegen.verification.statements.projections import projection_checks
from splitformer.codegen.verification.statements.recovery import recovery_checks
from splitformer.codegen.verification.statements.rms_norm_scale import rms_norm_scale_check
from splitformer.codegen.verification.statements.sign import sign_check
from splitformer.symbolic.adjoint import Adjoint, derive_adjoint
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.network_spec import NetworkSpec
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import is_builtin
from splitformer.symbolic.markdown import inert
from splitformer.symbolic.names import check_distinct

from .attention_kernel import attention_kernel_checks
from .causality import causality_checks
from .circuits import circuits_check
from .convergence import SLOPE_AGREEMENT, Study, convergence_study, local_slopes, plot_studies, plot_study
from .groups import GROUPS
from .guard import guarded
from .network_adjoint_tests import network_adjoint_tests
from .network_semantics import network_semantics_checks
from .paper import paper_checks
from .adjoint_tests import scheme_adjoint_tests
from .across_layers import across_convergence, across_order_check, convergence_budget
from .emitted import emitted_with_adjoints, torch_installed
from .torch_gradients import torch_gradient_check
from .scheme_checks import scheme_checks as semantics_checks, skipped_because
from .semantics import unevaluable
from .structure import attention_checks

__all__ = ["network_checks", "CheckReport", "run_checks", "order_check", "convergence_check", "TOLERANCE"]

#: How far the empirical order may be from the series order.
TOLERANCE = 0.3


@dataclass
class CheckReport:
    checks: list[Check] = field(default_factory=list)
    orders: dict[str, dict] = field(default_factory=dict)
    plots: dict[str, Path] = field(default_factory=dict)
    leading_text: dict[str, str] = field(default_factory=dict)
    studies: dict[str, Study] = field(default_factory=dict)
    #: Called with each check as it is added (``splitformer check`` prints progress on a terminal).
    progress: Callable[[Check], None] | None = field(default=None, repr=False, compare=False)

    def add(self, *checks: Check) -> None:
        for check in checks:
            self.checks.append(check)
            if self.progress is not None:
                self.progress(check)

    @property
    def holds(self) -> bool:
        return all(check.holds for check in self.checks)

    def as_json(self) -> str:
        document = {"checks": [check.as_dict() for check in self.checks], "orders": self.orders}
        return json.dumps(document, indent=2, ensure_ascii=False)

    def as_text(self) -> str:
        lines = []
        for check in self.checks:
            lines.append(f"{check.label}  {check.id}  [{check.method}]")
            lines.extend(textwrap.wrap(check.statement, 96, initial_indent="      ", subsequent_indent="      "))
            lines.extend(textwrap.wrap("→ " + check.detail, 96, initial_indent="      ", subsequent_indent="        "))
        if self.orders:
            lines.append("")
            lines.append(f"{'scheme':20} {'order':>5} {'splitting':>9} {'tied':>4}  leading local error (own solvers)")
            for name, order in self.orders.items():
                lines.append(f"{name:20} {_shown(order['order']):>5} {_shown(order['splitting_order']):>9} "
                             f"{_shown(order['tied_splitting_order']):>4}  {self.leading_text[name]}")
            lines.append("generators: one per operator instance and the maps it is read through (on, then, combine, "
                         "shift); tied: the instances of one kind and options merged (shared parameters).")
            for name, order in self.orders.items():
                for title, key in (("own solvers", "conditions"), ("exact sub-flows", "splitting_conditions")):
                    if order[key]:
                        lines.append(f"order conditions of {name} ({title}), coloured rooted trees by size:")
                        lines.extend(textwrap.wrap("; ".join(order[key]), 96, initial_indent="  ",
                                                   subsequent_indent="  "))
            lines.extend(textwrap.wrap("Orders: " + PROJECTIONS + ".", 96))
        failed = sum(not check.holds for check in self.checks)
        skipped = sum(check.status == "skip" for check in self.checks)
        lines.append("")
        lines.append(f"{len(self.checks) - failed - skipped} passed, {failed} failed"
                     + (f", {skipped} skipped" if skipped else ""))
        return "\n".join(lines)

    def as_markdown(self) -> str:
        lines = ["| | check | method | statement | detail |", "| --- | --- | --- | --- | --- |"]
        for check in self.checks:
            cells = [check.mark, f"`{check.id}`", check.method, check.statement, check.detail]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        if self.orders:
            lines += ["", "| scheme | order | splitting order | leading local error |", "| --- | --- | --- | --- |"]
            for name, order in self.orders.items():
                lines.append(f"| `{name}` | {_shown(order['order'])} | {_shown(order['splitting_order'])} | "
                             f"${order['leading_error']}$ |")
        return inert("\n".join(lines), "the check table")

    def __str__(self) -> str:
        return self.as_text()

    def _repr_markdown_(self) -> str:
        return self.as_markdown()


def _shown(order: int | None) -> str:
    return "—" if order is None else str(order)


def order_check(scheme: Scheme, result: OrderResult) -> Check | None:
    """The orders the scheme file claims against the series; ``None`` when it claims none."""
    if not scheme.claims:
        return None
    computed = {"order": result.order, "splitting_order": result.splitting_order}
    wrong = {key: (claimed, computed[key]) for key, claimed in scheme.claims.items() if computed[key] != claimed}
    claimed = ", ".join(f"{key} {value}" for key, value in scheme.claims.items())
    return Check(
        f"order/{scheme.name}", scheme.name,
        f"One step of {scheme.name} has {claimed} (local error O(h^(p+1)) against the exact flow on nonlinear "
        f"fields: every order condition on rooted trees of at most p nodes, coloured by the operator instances "
        f"({', '.join(result.generators)}), holds, and one of p + 1 nodes fails); " + PROJECTIONS + ".",
        "symbolic", not wrong,
        (f"trees: order {result.order}, splitting order "
         f"{_given(result, 'splitting_order', result.splitting_order)}; "
         f"leading error {result.leading_error_text}; conditions (own solvers) {'; '.join(result.conditions)}"
         + (f"; (exact sub-flows) {'; '.join(result.splitting_conditions)}" if result.splitting_conditions else "")
         if not wrong else "; ".join(f"{key}: claimed {c}, the trees give {_given(result, key, s)}"
                                     for key, (c, s) in wrong.items())),
    )


def _given(result: OrderResult, key: str, order: int | None) -> str:
    """An order the trees give, ``—`` with its reason."""
    if order is not None:
        return str(order)
    if key == "splitting_order":
        return f"— ({result.splitting_note})"
    return f"— (no order condition fails on trees of up to {result.checked_nodes} nodes)"


def convergence_check(scheme: Scheme, study: Study, order: int, exact_subflows: bool = False) -> Check:
    """The tree order against the slope measured on nonlinear fields: fails when they disagree; skipped, saying so,
    where the reference solution is not finite at T = 1 (no order can be measured there)."""
    errors = ", ".join(f"{error:.2e}" for error in study.errors)
    what = ("splitting order (each substep's flow integrated accurately)" if exact_subflows
            else "order (the scheme's own solvers)")
    name = f"convergence/{scheme.name}" + ("/splitting" if exact_subflows else "")
    causal = ", attention over every token: the causal support, which no order condition reads, left out"
    statement = (f"On the continuous model with frozen smooth nonlinear fields (tanh activation, projections held "
                 f"out{causal if scheme.causal else ''}), the error at T = 1 of {scheme.name} with N_t = "
                 f"{', '.join(map(str, study.steps))} steps "
                 f"decays with slope within {TOLERANCE} of its {what} {order} from the order conditions on trees.")
    if not study.finite_reference:
        return Check(name, scheme.name, statement, SKIPPED, True,
                     "not checked: the reference solution at T = 1 (RK4, refined until it converges) is not finite "
                     "from the study's random state and parameters: the flow itself blows up before T = 1 (a field "
                     "growing faster than the state, on a state no projection bounds), or it is too stiff for an "
                     "explicit reference (a field with a large Lipschitz constant: RK4 is unstable at its finest "
                     "step), or the evaluator has no finite value there; so there is no error to measure")
    if not study.asymptotic:
        slopes = ", ".join(f"{slope:.2f}" for slope in local_slopes(study.steps, study.errors))
        return Check(name, scheme.name, statement, SKIPPED, True,
                     f"not checked: the errors are not in the asymptotic range at N_t up to {study.steps[-1]} (errors "
                     f"{errors}; local slopes {slopes}, the last two {SLOPE_AGREEMENT} or more apart): the error is "
                     "still in transition at these steps (stiff frozen fields at the study's random state, such as an "
                     "output normalized by a then projection, or terms of two orders of unlike size), so the slope of "
                     "these steps is no order")
    finite = all(math.isfinite(error) for error in study.errors)
    above = finite and study.slope > order + TOLERANCE
    return Check(
        name, scheme.name, statement, "numeric", finite and abs(study.slope - order) <= TOLERANCE,
        f"empirical order {study.slope:.3f} (fit over the {'two' if exact_subflows else 'three'} finest steps); "
        f"errors {errors}" + ("; above the trees' order: the order conditions hold for any fields, and these "
                              "fields may satisfy more of them (commuting fields make every splitting exact)"
                              if above else "")
        if finite else f"the scheme's steps blow up where the flow does not: errors {errors}",
    )


def scheme_checks(scheme: Scheme, program: Program | None = None, plots: Path | None = None,
                  report: CheckReport | None = None, only: frozenset[str] = frozenset(GROUPS)) -> CheckReport:
    """The checks of one scheme in the groups ``only``, added to ``report``; a group of checks that raises is
    reported as failed."""
    report = report or CheckReport()
    derived = functools.cache(lambda: program or derive(scheme))  # for the groups that read it only
    name = scheme.name
    if "semantics" in only:
        report.add(*guarded(f"semantics/{name}", name, lambda: semantics_checks(scheme, derived())))
    if "recovery" in only:
        report.add(*guarded(f"recovery/{name}", name, lambda: recovery_checks(scheme, derived())))
        if scheme.name == "paper-lie" and is_builtin(scheme):
            report.add(*guarded(f"paper/{name}", name, lambda: paper_checks(scheme)))
    adjoint = functools.cache(lambda: derive_adjoint(derived()))  # derived once, for both checks that need it
    if "adjoint" in only:
        report.add(*guarded(f"adjoint/{name}", name, lambda: adjoint_checks(scheme, derived(), adjoint)))
    emitted = only & {"causality", "adjoint-test"}
    if emitted:
        report.add(*guarded(f"emitted/{name}", name, lambda: _emitted_checks(scheme, derived(), adjoint(), emitted)))
    if not only & {"order", "convergence"}:
        return report
    claimed = guarded(f"order/{name}", name, lambda: _orders(scheme, report))
    if "order" in only or any(check.method == "crashed" for check in claimed):  # a crash stops the study too
        report.add(*claimed)
    order = report.orders.get(name, {}).get("order")
    if order is None or "convergence" not in only:  # order None: an exact step, no error to converge
        return report
    reasons = unevaluable(scheme)
    if reasons:
        report.add(_convergence_skipped(scheme, reasons))
        return report
    report.add(*guarded(f"convergence/{name}", name, lambda: _convergence(scheme, order, plots, report)))
    return report


def _emitted_checks(scheme: Scheme, program: Program, adjoint: Adjoint, groups: frozenset[str]) -> list[Check]:
    """The Lean causality statements and Devito's adjoint tests (those of ``groups``), on the emitted NumPy module
    with its ``vjp``; and torch's gradients through the emitted Block against that ``vjp`` where torch is installed."""
    with_torch = "adjoint-test" in groups and torch_installed()
    modules = emitted_with_adjoints(scheme, program, adjoint, ("numpy", "torch") if with_torch else ("numpy",))
    emitted = modules["numpy"]
    checks = [*(causality_checks(scheme, emitted, program.uncached) if "causality" in groups else ()),
              *(scheme_adjoint_tests(scheme, emitted) if "adjoint-test" in groups else ())]
    if with_torch:
        checks.append(torch_gradient_check(scheme, emitted, modules["torch"]))
    return checks


def _orders(scheme: Scheme, report: CheckReport) -> Check | None:
    """The series orders of ``scheme``, recorded in ``report``; the check of the orders its file claims."""
    if scheme.across_layers is not None:
        check, report.orders[scheme.name] = across_order_check(scheme)
        report.leading_text[scheme.name] = report.orders[scheme.name]["leading_error"]
        return check
    result = splitting_order(scheme)
    report.orders[scheme.name] = {
        "order": result.order, "splitting_order": result.splitting_order, "leading_error": result.leading_error,
        "exact_subflows_error": result.exact_subflows_error,
        "tied_splitting_order": result.tied_splitting_order,
        "generators": result.generators, "projections": PROJECTIONS,
        "conditions": list(result.conditions), "splitting_conditions": list(result.splitting_conditions),
        "checked_nodes": result.checked_nodes, "splitting_note": result.splitting_note,
    }
    report.leading_text[scheme.name] = result.leading_error_text
    return order_check(scheme, result)


def _convergence(scheme: Scheme, order: int, plots: Path | None, report: CheckReport) -> list[Check]:
    """The convergence study at the series order; a splitting order above it by a study of exact sub-flows."""
    if scheme.across_layers is not None:
        skipped = convergence_budget(scheme)
        if skipped is not None:
            return [skipped]
        check, report.studies[scheme.name] = across_convergence(scheme, order)
        if plots is not None:
            report.plots[scheme.name] = plot_study(report.studies[scheme.name], order,
                                                   plots / f"{scheme.module_name}_convergence.png")
        return [check]
    study = report.studies[scheme.name] = convergence_study(scheme, order=order)
    if plots is not None:
        report.plots[scheme.name] = plot_study(study, order, plots / f"{scheme.module_name}_convergence.png")
    checks = [convergence_check(scheme, study, order)]
    splitting = report.orders[scheme.name]["splitting_order"]
    if splitting is not None and splitting > order:  # not seen by the study above
        split = convergence_study(scheme, order=splitting, exact_subflows=True)
        checks.append(convergence_check(scheme, split, splitting, exact_subflows=True))
    return checks


def _convergence_skipped(scheme: Scheme, reasons: dict[str, str]) -> Check:
    return Check(f"convergence/{scheme.name}", scheme.name,
                 f"The error of {scheme.name} at T = 1 decays with the series order.", SKIPPED, True,
                 skipped_because(reasons))


def network_checks(spec: NetworkSpec, report: CheckReport | None = None,
                   only: frozenset[str] = frozenset(GROUPS)) -> CheckReport:
    """The checks of one network in the groups ``only``, added to ``report``: its derived programs against the
    published network (``recovery``) and its derived adjoint against differences (``adjoint``), its emitted NumPy
    module against the independent evaluator (``semantics``) and its ``vjp`` (``adjoint-test``)."""
    report = report or CheckReport()
    name = spec.name
    if only & {"recovery", "adjoint"}:
        report.add(*guarded(f"network/{name}", name, lambda: network_statement_checks(spec, only)))
    if "semantics" in only:
        report.add(*guarded(f"semantics/{name}/emitted", name, lambda: network_semantics_checks(spec)))
    if "adjoint-test" in only:
        report.add(*guarded(f"adjoint-test/{name}", name, lambda: network_adjoint_tests(spec)))
    return report


def run_checks(schemes: list[Scheme], plots: Path | None = None,
               progress: Callable[[Check], None] | None = None, networks: list[NetworkSpec] = (),
               only: frozenset[str] = frozenset(GROUPS)) -> CheckReport:
    """The general checks, then every scheme's and every network's, of the groups ``only``; ``plots`` also gets
    ``convergence.png`` with all schemes."""
    check_distinct([scheme.name for scheme in schemes] + [network.name for network in networks], "check")
    report = CheckReport(progress=progress)
    if "general" in only:
        for group, checks in (("projections", projection_checks), ("rms-norm", rms_norm_scale_check),
                              ("sign", sign_check), ("activations", activation_checks),
                              ("attention", attention_checks), ("attention-kernel", attention_kernel_checks),
                              ("circuits", circuits_check), ("llm", llm_checks), ("adjoint", general_adjoint_checks)):
            report.add(*guarded(group, None, checks))
    for scheme in schemes:
        scheme_checks(scheme, plots=plots, report=report, only=only)
    for network in networks:
        network_checks(network, report, only)
    if plots is not None and report.studies:
        plot_studies(list(report.studies.values()), plots / "convergence.png")
    return report

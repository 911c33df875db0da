"""The derivation report of a scheme: Markdown whose math renders on code-hosting sites."""

from __future__ import annotations

from pathlib import Path

import sympy as sp

from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.equation import MASTER_EQUATION, equation_latex
from splitformer.symbolic.program import Program
from splitformer.symbolic.projections import derive_layer_norm_projection, derive_relu_projection
from splitformer.symbolic.references import has_published_reference
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence
from splitformer.symbolic.scheme_file import derive_arguments

from .document import Document, Section, domain_rows, render_document
from .report_adjoint import adjoint_context

__all__ = ["render_report", "check_ids"]


def _tableaux(sequence: Sequence) -> list[dict]:
    """The Runge–Kutta tableaux a scheme uses, once each, in order."""
    found: dict[str, dict] = {}
    for step in sequence.steps:
        if isinstance(step, RungeKutta):
            method = step.tableau
            found.setdefault(method.name, {"name": method.name, "title": method.title, "order": method.order(),
                                           "latex": method.latex()})
        elif isinstance(step, Parallel):
            for branch in step.branches:
                for method in _tableaux(branch):
                    found.setdefault(method["name"], method)
    return list(found.values())


def _has_parallel(scheme: Scheme) -> bool:
    return any(isinstance(step, Parallel) for step in scheme.body.steps)


#: Kinds that apply the scheme's activation.
_ACTIVATED = {"feed-forward", "gated-feed-forward"}


def _projection_kinds(scheme: Scheme) -> set[str]:
    return {kind for kind in scheme.operators.values() if OPERATOR_KINDS[kind].is_projection}


def _other_projections(scheme: Scheme) -> list[dict]:
    """Sections for the projections other than LayerNorm: each set's derivation steps."""
    sections = []
    for kind in sorted(_projection_kinds(scheme) - {"layer-norm"}):
        cls = OPERATOR_KINDS[kind]
        constraints = getattr(cls, "constraints", None)
        if constraints is None:
            continue
        projection = cls.projection()
        extra = ""
        if projection.distance is not None:
            extra = rf"Squared distance of the minimizer ($\gamma = 0$): $\|u - v\|^2 = {sp.latex(projection.distance)}$."
        sections.append({"title": f"Projection onto ${constraints.latex}$ ({kind})", "steps": projection.steps,
                         "extra": extra})
    return sections


def check_ids(scheme: Scheme, exact: bool = False) -> list[str]:
    """The ids of the ``splitformer check`` checks that back the claims of this report."""
    kinds = set(scheme.operators.values())
    ids = []
    if "layer-norm" in kinds:
        ids += [f"theorem-3.1/{part}" for part in ("closed-form", "constraints", "kkt", "minimizer", "beta-zero")]
        ids += ["layer-norm/eps-ghost", "layer-norm/scale-invariance", "subdifferential/sign"]
    if "rms-norm" in kinds:
        ids += ["rms-norm/closed-form", "rms-norm/kkt", "rms-norm/distance"]
    if "rotary-attention" in kinds:
        ids += ["rope/relative-kernel", "gqa/repeated-heads"]
    ids += [f"projection/{kind}/{part}" for kind in sorted(_projection_kinds(scheme) - {"layer-norm"})
            for part in ("constraints", "minimizer")]
    if kinds & _ACTIVATED:
        ids += (["relu/kkt"] if scheme.activation == "relu" else []) + [f"activation/{scheme.activation}"]
    ids += [f"semantics/{scheme.name}/derived", f"semantics/{scheme.name}/emitted", f"structure/{scheme.name}/stack"]
    if has_published_reference(scheme):
        ids += [f"recovery/{scheme.name}/symbolic", f"recovery/{scheme.name}/numeric"]
    ids += [f"adjoint/{kind}-jacobian" for kind in ("layer-norm", "rms-norm") if kind in kinds]
    ids += ["adjoint/relu-subgradient"] if "feed-forward" in kinds and scheme.activation == "relu" else []
    ids += [f"adjoint/{scheme.name}/finite-difference", f"adjoint/{scheme.name}/negative-control"]
    if scheme.claims:
        ids.append(f"order/{scheme.name}")
    return ids if exact else ids + [f"convergence/{scheme.name}"]


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file this process can see (a folder it may not search hides it: no link to it)."""
    try:
        return path.is_file()
    except OSError:
        return False


def render_report(scheme: Scheme, program: Program, plots: Path | None = None, adjoint=None, *, order) -> str:
    """The Markdown report of ``program``, derived from ``scheme``; ``plots`` may hold its convergence plot.

    ``order``: the scheme's orders (``verification.statements.order.splitting_order``), which
    the caller computes: the report prints them and imports no verification.
    """
    kinds = set(scheme.operators.values())
    projections = []
    if "layer-norm" in kinds:
        projection = derive_layer_norm_projection()
        projections.append({
            "title": r"Projection onto $S_1(\sigma_1, \sigma_2)$ (Theorem 3.1) with LayerNorm's $\varepsilon$",
            "steps": projection.steps,
            "extra": rf"Squared distance of the minimizer ($\gamma = 0$): $\|u - v\|^2 = {sp.latex(projection.distance)}$, "
                     r"i.e. $|\Omega_y|\,[(\sigma_2 - \sqrt\beta)^2 + (\sigma_1 - \alpha)^2]$ with $|\Omega_y| = N$ "
                     r"at unit spacing. The hypothesis $\beta > 0$ is needed: for $\beta = 0$ every point of the "
                     r"sphere is at the same distance and the projection is not unique.",
        })
    projections += _other_projections(scheme)
    if kinds & _ACTIVATED and scheme.activation == "relu":
        projections.append({
            "title": r"ReLU as the projection onto $S_2 = \{u \ge 0\}$",
            "steps": derive_relu_projection().steps,
            "extra": "The problem separates pointwise, so this scalar derivation is the whole projection.",
        })
    plot = f"{scheme.module_name}_convergence.png"
    sections = [Section("The continuous equation", partial="report/scheme/continuous.md.j2",
                        domains=domain_rows((TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN))),
                Section("Derived projections", partial="report/scheme/projections.md.j2"),
                Section("One step, substep by substep", partial="report/scheme/substeps.md.j2"),
                Section("Discretization notes", partial="report/scheme/notes.md.j2"),
                Section("Splitting order and checks", partial="report/scheme/order.md.j2"),
                *([Section("Training as optimal control: the derived adjoint", partial="report/scheme/adjoint.md.j2")]
                  if adjoint is not None else []),
                Section("Generated code", partial="report/scheme/code.md.j2")]
    activation = f" with {scheme.activation}" if scheme.activation != "relu" else ""
    return render_document(Document(f"`{scheme.name}`{activation}", "scheme", scheme.name, derive_arguments(scheme),
                                    scheme.summary, sections, "report/scheme/intro.md.j2", dict(
        adjoint=adjoint_context(adjoint) if adjoint is not None else None,
        order=order,
        checks=check_ids(scheme, exact=order.order is None),
        plot=f"../plots/{plot}" if plots is not None and _is_file(plots / plot) else None,
        scheme=scheme,
        program=program,
        master=MASTER_EQUATION,
        equation=equation_latex(scheme),
        projections=projections,
        parallel=_has_parallel(scheme),
        tableaux=_tableaux(scheme.body),
    )))

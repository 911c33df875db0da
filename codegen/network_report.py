"""A network's derivation report, one template for all: its program's ``Section``s (prose, stages, updates), code,
checks and derived adjoint piece by piece; an operator kind's ``discretization`` is written where the kind first appears."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import replace

from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.equation import equation_latex
from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, KERNEL_ROWS, ROWS
from splitformer.symbolic.latex import to_latex
from splitformer.symbolic.network_derivation import TOKENS_DISCRETE, TOKENS_LATEX
from splitformer.symbolic.network_program import NetworkProgram
from splitformer.symbolic.network_spec import network_derive_argument

from .document import Document, Section, domain_rows, render_document
from .network_inputs import numpy_functions

__all__ = ["render_network_report", "network_sections", "NetworkSections"]

#: A network's sections, adjoint pieces (``(title, Adjoint)``, derived when called), note on them, checks, domains.
NetworkSections = namedtuple("NetworkSections", "sections pieces note checks domains")
_VISION = (CHANNELS, KERNEL_ROWS, ROWS, COLS, TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN, CLASSES)


def _token(program: NetworkProgram) -> NetworkSections:
    spec, scheme, blocks = program.spec, program.spec.scheme, program.blocks
    steps = "".join(f"\n- {record.title}: $ {record.rule} $" for record in blocks["step"].records)
    final = (rf", followed by the projection onto $S_1$ (Theorem 3.1 with LayerNorm's $\varepsilon$), then gain and "
             rf"bias: $ {blocks['final'].records[0].rule} $" if "final" in blocks else "")
    sections = [Section("The continuous model", rf"""An initial-value problem for the master equation, then a readout:

$$
u(x, y, 0) = f(x, y), \qquad u_t = {equation_latex(scheme).removeprefix("u_t = ")}, \qquad
\ell = \mathcal{{R}}[u(\cdot, \cdot, T)]:
$$

the initial condition $f$ is the embedding `{spec.embedding.key}`; $N_t$ steps of `{scheme.name}` ({scheme.activation})
advance $u$ from $t = 0$ to $T = N_t \Delta t$; the readout $\mathcal{{R}}$ is `{spec.readout.key}`. The token domain is
$\Omega_x = \{{x_{{\mathrm{{cls}}}}\}} \cup \Omega_{{\mathrm{{grid}}}}$, the patch grid
$\Omega_{{\mathrm{{grid}}}} = \Omega_{{x_1}} \times \Omega_{{x_2}}$; its $N_x = 1 + N_1 N_2$ nodes are enumerated class
node first, then the grid row by row (node $1 + N_2 p + q$). Attention integrates over all of $\Omega_x$ (its kernel
does not depend on where a node lies): the steps are those of the one-dimensional token domain."""),
                Section("The initial condition: patch embedding", rf"""The class node's value and the position term
complete the patch embedding's $f$ to the initial condition:

$$
{TOKENS_LATEX}
$$

$$
{TOKENS_DISCRETE}
$$""", program.parts["embedding"]),
                Section(f"The steps: `{scheme.name}` ({scheme.activation})", rf"""Each step is derived in its own
report (`{scheme.module_name}.md`); its substeps are
{steps}

one per layer, with its own controls{final}. Attention's score scale is $|\Omega_e|^{{-1/2}} \Delta e = 1/\sqrt{{N_e}}$
(feature grids of unit spacing), and the token spacing $\Delta x$ cancels in the softmax: the grid of patches and the
class node enter only through the node set."""),
                Section("The readout", stages=program.parts["readout"])]
    titles = {"readout": "The readout", "final": "The final projection", "step": "One step (each layer)",
              "embedding": "The initial condition and the embedding"}
    programs = {"readout": program.pieces["readout"].program, **{name: blocks[name] for name in ("final", "step")
                                                                 if name in blocks},
                "embedding": program.pieces["embedding"].program}
    note = r"""The initial condition is written in index notation for this purpose: $t_{0,l} = c^{\mathrm{cls}}_{l}$,
$t_{1 + N_2 p + q,\, l} = f_{p,q,l}$, $u^{(0)}_{i,l} = t_{i,l} + E_{i,l}$. The costate runs readout →""" + (
        " final projection →" if "final" in blocks else "") + "\nsteps (last first) → initial condition → patch embedding."
    return NetworkSections(sections, lambda: [(titles[name], derive_adjoint(value)) for name, value in programs.items()],
                           note, "{n}/translation-equivariance recovery/{n}/symbolic "
                           "recovery/{n}/numeric {n}/negative-controls", _VISION)


def _grid(program: NetworkProgram) -> NetworkSections:
    spec, parts, circ = program.spec, program.parts, r" \circ "
    projected = spec.projection and spec.operators[spec.projection].kind == "relu-projection"
    named = (spec.projection or "").replace("_", r"\_")
    outer = (r"\mathrm{Proj}_{S_2}" if projected else rf"\mathrm{{{named}}}") if spec.projection else ""
    proj = (rf"{outer}\big(", r"\big)") if spec.projection else ("", "")
    transfer = rf"{circ.join(reversed(spec.transfer))}\ \text{{or}}\ R = " if spec.transfer else ""
    after = ("" if not spec.projection else " The update is projected onto $S_2$ ($u \\ge 0$)." if projected else
             rf" The operator ${outer}$ acts on the update (the step's projection slot; it is no projection).")
    carries = (r"otherwise $R$ is the composition of the transfer's operators, below (a strided $1\times 1$ "
               r"convolution and a BatchNorm in ResNet's projection shortcut); the module runs $R = \mathrm{Id}$ "
               r"when its parameters are absent" if spec.transfer else r"this network has no other")
    sections = [Section("One step of the equation on the 2-D grid", rf"""The master equation on a 2-D grid
$\Omega_x = \Omega_{{x_1}} \times \Omega_{{x_2}}$, the channels as the feature domain, no attention: the field composes
integral operators with relative kernels of local support, per-channel affine maps and the projection onto $S_2$. One
step, with $\Delta t = 1$ in the emitted code:

$$
u^{{+}} = {proj[0]}R\,u + \Delta t\, F(u){proj[1]}, \qquad F = {circ.join(reversed(spec.field))}, \qquad
R = {transfer}\mathrm{{Id}}
$$

$R$ carries the state to the grid and channels of $F(u)$: the identity when they stay; {carries}.{after}"""),
                Section("The field $F$, operator by operator", stages=parts["field"]),
                Section("The transfer $R$", "" if parts["transfer"] else "$R$ is the identity (the skip connection).",
                        parts["transfer"]),
                Section("The update", stages=parts["update"])]
    note = r"""The transfer is written as an assignment $(R u)_{l,p,q} = \dots$; ReLU's derivative is $[v > 0]$
(subgradient $0$ at $0$); BatchNorm's statistics get gradients like any control."""
    titles = {"step_with": f"R = {' ∘ '.join(reversed(spec.transfer))}", "step_identity": "R = 1"}
    return NetworkSections(sections, lambda: [(titles[name], piece.adjoint)
                                              for name, piece in program.pieces.items()], note, "{n}/translation-equivariance {n}/batch-norm-affine",
        (CHANNELS, replace(FEATURES, description="channels F writes (the output's)"),
         replace(ROWS, description="rows of the field's grid"), replace(COLS, description="columns of the field's grid"),
         KERNEL_ROWS))


def _cvt(program: NetworkProgram) -> NetworkSections:
    norm1, *projections, attention, first, norm2, ffn, second = program.parts["step"]
    sections = [Section("One continuous model on successively coarser grids", r"""Stage $s$ has its own token grid
$\Omega_s$ (coarser than $\Omega_{s-1}$) and feature domain $\Omega_{y,s}$ (wider); its initial condition is the
previous stage's final state carried over by the **convolutional token embedding**, a strided convolution
$\mathcal{K}_s$ (a restriction in space, a lifting in features, as in `unet-level`) and the projection onto $S_1$;
$N_s$ pre-LN GELU steps advance $u_s$:

$$
u_s(\cdot, \cdot, 0) = \mathrm{Proj}_{S_1}\big(\mathcal{K}_s\, u_{s-1}(\cdot, \cdot, T_{s-1})\big), \qquad
u^{(1)} = u + \Delta t\, \mathcal{A}^{\mathrm{conv}}\big(\mathrm{Proj}_{S_1}(u)\big), \qquad
u^{(2)} = u^{(1)} + \Delta t\, \mathcal{F}\big(\mathrm{Proj}_{S_1}(u^{(1)})\big).
$$

The class node joins the token domain of the last stage only:
$\Omega_x = \{x_{\mathrm{cls}}\} \cup \Omega_{\mathrm{grid}}$, class node first, then the grid row by row."""),
                Section("The convolutional token embedding", stages=program.parts["embedding"]),
                Section("Attention with convolutional projections over a coarser quadrature grid", r"""Q, K and V are
read from the projected state on the grid: a depth-wise convolution, BatchNorm, then point-wise affine maps (in the
attention operator). The class node is not convolved: it joins each of Q, K, V as is.""",
                        (*projections, attention)),
                Section("The rest of the step", stages=(norm1, norm2, ffn, first, second)),
                Section("The readout", "The projection onto $S_1$ of the class node's final state, then the head.",
                        program.parts["readout"])]
    note = r"""Each program is a stage piece with the chaining between its operators written as assignments in index
notation (`symbolic/cvt_pieces.py`), the chaining's adjoint derived with the rest: the residual sums pass the costate
on and add the field's; the projected tokens' grid $g_{l,p,q} = n_{o + N_2 p + q,\,l}$ ($o = 1$ with the class node,
else $0$) and the token concatenations $q^{\mathrm{in}}_{0,l} = n_{0,l}$,
$q^{\mathrm{in}}_{o + N_2 p + q,\,l} = \mathcal{B}_{l,p,q}$ (K and V on the key grid $(f, h)$ of $N^k_1 \times N^k_2$
points) have their transposes as adjoints (`_place_rows`); the class node joins unconvolved ($u_{0,l} = c_l$): its
gradient is node 0's costate summed over the batch. The costate runs readout → class node and grid → stages (last first): steps (last first) → token
embedding → the previous stage's grid; the costates of `forward`'s two outputs (grid, class node) add up."""
    return NetworkSections(sections, lambda: [
        (f"`{name}` (its output's costate → that of `{piece.input}`)", piece.adjoint)
        for name, piece in reversed(program.pieces.items())], note, "{n}/translation-equivariance "
        "{n}/batch-norm-affine {n}/key-spacing {n}/score-scale recovery/{n}/symbolic recovery/{n}/numeric", _VISION)


#: Each composition's report: its prose, its sections and the titles of its adjoint pieces.
_COMPOSITIONS = {"token": _token, "grid": _grid, "cvt": _cvt}


def network_sections(program: NetworkProgram) -> NetworkSections:
    """The sections of a derived network."""
    return _COMPOSITIONS[program.composition](program)


def render_network_report(program: NetworkProgram) -> str:
    """The Markdown report of a derived network: its composition's sections, then its code, checks and adjoint."""
    network, spec = network_sections(program), program.spec
    stages = [stage for section in network.sections for stage in section.stages if hasattr(stage, "operator")]
    positions = {s.operator.key: r",\quad ".join(f"{to_latex(symbol)} = {to_latex(value)}" for symbol, value in
                                                  getattr(s.operator, "positions", dict)().items()) for s in stages}
    first, *rest = network.sections
    sections = [first._replace(domains=domain_rows(network.domains)), *rest,
                Section("The code", partial="report/network/code.md.j2"),
                Section("Checks", partial="report/network/checks.md.j2"),
                Section("Training as optimal control: the derived adjoint", partial="report/network/adjoint.md.j2")]
    return render_document(Document(f"`{spec.name}`", "network", spec.name, network_derive_argument(spec),
                                    spec.summary, sections, context=dict(
        module=spec.module_name, positions=positions, checks=network.checks.format(n=spec.name).split(),
        pieces=network.pieces(), note=network.note, adjoint_number=len(sections),
        batch_norm=any(s.operator.kind == "batch-norm" for s in stages),
        functions=numpy_functions(program.composition, "readout" in program.parts))))

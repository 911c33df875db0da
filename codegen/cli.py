"""The ``splitformer`` command line: list, show, derive, check, compare, study (``--help`` explains each).

Bad input ends in one ``error: …`` line on stderr and exit status 2, with nothing written.
An interrupt (Ctrl-C) ends in one line and status 130, whatever further interrupts arrive; a reader that closes the pipe early
(``splitformer check | head -1``) ends the command quietly with status 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from splitformer.symbolic import __version__
from splitformer.symbolic.errors import SplitformerError

from .verification.groups import GROUPS

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise SplitformerError(message)


_ACTIVATIONS = "relu (default: the projection onto u ≥ 0), relu-squared, gelu, silu, tanh or gelu-tanh"
_SCHEME = "a built-in name (see 'splitformer list') or the path of a scheme file (TOML)"
_ENVIRONMENT = """\
environment:
  SPLITFORMER_CACHE   folder of the disk cache of derived projection formulas
                      (default ~/.cache/splitformer, also for 'on'/'1'/'true'/'yes';
                      'off'/'0'/'false'/'no' disables the cache; a relative folder is
                      taken from the current folder)"""
_EXAMPLES = {
    None: """\
examples:
  splitformer list
  splitformer show pre-ln --format latex
  splitformer derive post-ln --backend all --out generated
  splitformer check rk2 --plots plots""",
    "list": "example:\n  splitformer list",
    "show": """\
examples:
  splitformer show post-ln                       the discrete program in index notation
  splitformer show pre-ln --format latex         an align* environment for a paper
  splitformer show post-ln --format toml > my-scheme.toml   a scheme file to edit""",
    "derive": """\
examples:
  splitformer derive post-ln                     NumPy and PyTorch code and a report in generated/
  splitformer derive pre-ln --activation gelu --backend torch --out build
  splitformer derive my-scheme.toml --load my_operators.py --passes none""",
    "check": """\
examples:
  splitformer check                              every built-in scheme
  splitformer check rk2 my-scheme.toml --format json > checks.json
  splitformer check post-ln pre-ln --plots plots  one plot per scheme and plots/convergence.png""",
    "compare": """examples:
  splitformer compare post-ln macaron rk2 rk4
  splitformer compare pre-ln parallel --format latex --sizes d=512,d_ff=2048
  splitformer compare post-ln rk2 --plot convergence.png""",
    "study": """examples:
  splitformer study post-ln pre-ln macaron rk2              chars, the default budget (≤ 10 minutes on 2 cores)
  splitformer study pre-ln llama my-scheme.toml --task mqar --steps 500 --seeds 5 --out recall""",
}


def _command(commands, name: str, summary: str, description: str):
    return commands.add_parser(
        name, help=summary, description=description, epilog=f"{_EXAMPLES[name]}\n\n{_ENVIRONMENT}",
        formatter_class=argparse.RawDescriptionHelpFormatter)


def _load_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--load", action="append", default=[], metavar="FILE.py",
                         help="import a Python file first: the operator kinds, projections and Runge–Kutta "
                              "tableaux it registers become usable by name in scheme files (repeatable)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="splitformer", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Derive Transformer blocks as operator-splitting schemes of a continuous "
                    "integro-differential equation,\nemit NumPy and PyTorch code from the derived "
                    "formulas, and check the proofs in between.",
        epilog=f"{_EXAMPLES[None]}\n\n{_ENVIRONMENT}\n\n'splitformer COMMAND --help' explains each command.")
    parser.add_argument("--version", action="version", version=f"splitformer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _command(commands, "list", "built-in schemes, one a line: name, summary",
             "Print the built-in schemes, one a line: the name, then the one-line summary.")
    show = _command(commands, "show", "print a scheme and its derivation",
                    "Derive one step of SCHEME and print it.")
    show.add_argument("scheme", metavar="SCHEME", help=_SCHEME)
    show.add_argument("--format", choices=("text", "latex", "markdown", "toml"), default="text",
                      help="text (default): the discrete program in index notation, plain text; "
                           "latex: the equation and every assignment as one align* environment; "
                           "markdown: the derivation report; toml: the scheme file, to copy and change")
    show.add_argument("--activation", default=None, metavar="NAME", help=f"activation of the feed-forward: {_ACTIVATIONS}")
    _load_option(show)
    derive = _command(commands, "derive", "derive schemes and emit code and reports",
                      "Derive each SCHEME and write OUT/numpy/<name>.py, OUT/torch/<name>.py and the\n"
                      "derivation report OUT/reports/<name>.md (<name>: the scheme name with '-' as '_',\n"
                      "plus '_<activation>' for an activation other than the scheme's own and '_causal'\n"
                      "for --causal; --name replaces it). Nothing is written unless every scheme derives.")
    derive.add_argument("schemes", nargs="*", metavar="SCHEME", help=_SCHEME)
    derive.add_argument("--all-builtins", action="store_true", help="derive every built-in scheme as well")
    derive.add_argument("--backend", choices=("numpy", "torch", "all"), default="all",
                        help="numpy, torch, or all (default): which modules to write")
    derive.add_argument("--out", default="generated", metavar="DIR", help="output folder (default: generated)")
    derive.add_argument("--force", action="store_true",
                        help="overwrite files in --out that splitformer did not write, or made read-only")
    derive.add_argument("--activation", default=None, metavar="NAME", help=f"activation of the feed-forward: {_ACTIVATIONS}")
    derive.add_argument("--causal", action="store_true",
                        help="causal self-attention, as 'causal = true' in a scheme file gives: a KV cache "
                             "in the modules and causal=True by default")
    derive.add_argument("--name", default=None, metavar="NAME",
                        help="the name of the module and report (a scheme name: lower-case words joined by '-'); "
                             "one SCHEME only")
    derive.add_argument("--passes", default="all", metavar="LIST",
                        help="IR passes to run: all (default), none, or a comma-separated list of "
                             "inline-elementwise, local-kernel, one-hot, layer-norm-adjoint, layer-norm, kept-layer-norm, "
                             "rms-norm, gelu, gelu-tanh, silu, silu-adjoint, gelu-adjoint, convolution-adjoint, unroll-pairs, shared-trig, pair-tables, attention-adjoint, fused-attention, "
                             "matmul, fuse-projections, reuse-buffers, scratch-outputs, masked-sums")
    _load_option(derive)
    check = _command(commands, "check", "proof checks; exit 0 when all hold, 1 when one fails",
                     "Run every proof check that applies: the derived projections, the subdifferential\n"
                     "sign, activations as proximal maps, exact recovery of published blocks, the\n"
                     "splitting order by non-commutative series and a numeric convergence study.\n"
                     "Exit status 0 when all hold, 1 when one fails. On a terminal, one progress line\n"
                     "per check goes to stderr as it completes.")
    check.add_argument("schemes", nargs="*", metavar="SCHEME", help=f"{_SCHEME} (default: every built-in scheme)")
    check.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                       help="text (default): one entry per check and a table of orders; json: one object "
                            '{"checks": [...], "orders": {...}}; markdown: the same as tables')
    check.add_argument("--plots", default=None, metavar="DIR",
                       help="write DIR/<name>_convergence.png per scheme and DIR/convergence.png with every "
                            "scheme overlaid (needs matplotlib)")
    check.add_argument("--only", default=None, metavar="GROUP[,GROUP...]",
                       help="run only these groups of checks: " + ", ".join(GROUPS) + " (default: every group)")
    _load_option(check)
    compare = _command(commands, "compare", "schemes side by side: orders, leading error, cost, parameters",
                       "Derive each SCHEME and print one table: the order with its own substep solvers,\n"
                       "the splitting order with exact sub-flows, the leading local-error term, the operator\n"
                       "evaluations one step makes and the learned parameters of one block.")
    compare.add_argument("schemes", nargs="+", metavar="SCHEME", help=_SCHEME)
    compare.add_argument("--format", choices=("text", "markdown", "latex"), default="text",
                         help="text (default): aligned columns; markdown: a table with LaTeX math; "
                              "latex: a tabular environment")
    compare.add_argument("--activation", default=None, metavar="NAME", help=f"activation of the feed-forward: {_ACTIVATIONS}")
    compare.add_argument("--sizes", default=None, metavar="d=N,d_ff=M",
                         help="count the parameters at these sizes instead of as a polynomial in them (d, d_ff; "
                              "grouped heads' d_kv, n_heads for per-head controls, …): every size a count holds")
    compare.add_argument("--plot", default=None, metavar="FILE.png",
                         help="also write one convergence plot with every scheme overlaid (needs matplotlib)")
    _load_option(compare)
    _study_command(commands)
    return parser


def _load(name: str, activation: str | None):
    from splitformer.symbolic.scheme_file import load_scheme

    scheme = load_scheme(name)
    return scheme if activation is None else scheme.with_activation(activation)


def _load_any(name: str, arguments: argparse.Namespace):
    """The scheme or network ``name`` names; the scheme options (``--activation``, and for
    derive ``--causal``, ``--name``) are refused for a network, which names its own."""
    from splitformer.symbolic.network_spec import load_scheme_or_network
    from splitformer.symbolic.scheme import Scheme

    item = load_scheme_or_network(name)
    if isinstance(item, Scheme):
        return item if arguments.activation is None else item.with_activation(arguments.activation)
    for option, given in (("--activation", arguments.activation is not None), ("--causal", getattr(arguments, "causal", False)),
                          ("--name", getattr(arguments, "name", None) is not None)):
        if given:
            raise SplitformerError(f"{option} applies to schemes, not to the network {name!r} (it names its own)")
    return item


def _variant(scheme, causal: bool, name: str | None):
    """``scheme`` made causal (``--causal``) and named (``--name``)."""
    if causal:
        scheme = scheme.as_causal()
    if name is not None:
        try:
            scheme = scheme.with_name(name)
        except SplitformerError as error:
            raise SplitformerError(f"--name: {error}") from None
    return scheme


def _list() -> str:
    from splitformer.symbolic.builtins import builtin_names, builtin_summary

    from splitformer.symbolic.network_spec import network_names, network_summary

    rows = [(name, builtin_summary(name)) for name in builtin_names()]
    rows += [(name, f"(network) {network_summary(name)}") for name in network_names()]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {summary}" for name, summary in rows)


def _show(arguments: argparse.Namespace) -> str:
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.equation import equation_latex, equation_text

    from splitformer.symbolic.scheme import Scheme

    scheme = _load_any(arguments.scheme, arguments)
    if not isinstance(scheme, Scheme):
        from .pipeline import show_network

        return show_network(scheme, arguments.format, arguments.scheme)
    if arguments.format == "toml":  # the file's own text: nothing derived
        return _source_with_activation(scheme).rstrip("\n")
    from .render import narrowest_head

    narrowest_head(scheme)  # refuses a d_head narrower than an option asks, as `derive` and `check` do
    program = derive(scheme)
    if arguments.format == "markdown":
        from .report import render_report
        from .verification.statements.order import splitting_order

        return render_report(scheme, program, order=splitting_order(scheme)).rstrip("\n")
    across = scheme.across_layers
    if arguments.format == "latex":
        return program.latex(equation_latex(scheme), after=across.rows() if across else ())
    return "\n".join([f"{scheme.name}: {scheme.summary}", f"equation: {equation_text(scheme)}{_rescaled(scheme)}",
                      *([across.text()] if across else []),
                      f"activation: {scheme.activation}" if scheme.reads_activation() else
                      "activation: none taken (each activated operator names its own, or none has one)",
                      "as emitted: feature spacings Δe = Δh = 1 (--format latex keeps the rectangle rule's spacings)",
                      "", program.text()])


def _rescaled(scheme) -> str:
    """What a method across layers is consistent with, where it rescales the steps' field G (its series in Δt:
    momentum β sums to G/(1 − β))."""
    across = scheme.across_layers
    if across is None:
        return ""
    scale = across.order().scale  # a file's method is consistent (its weights sum to 1, 0 < β < 1): never None
    method = across.method + (f" momentum β = {across.momentum}" if across.momentum else "")
    return "" if scale == 1 else (f" = G, its steps' field; with {method} across layers the stack is consistent "
                                  f"with u_t = {scale}·G")


def _source_with_activation(scheme) -> str:
    """The scheme file, its ``activation`` line set to the scheme's (``--activation``)."""
    import re

    from splitformer.symbolic.scheme_file import parse_scheme

    if scheme.activation == scheme.declared_activation:
        return scheme.source  # the file as it is
    line = f'activation = "{scheme.activation}"'
    table = re.search(r"(?m)^\s*\[", scheme.source)  # top-level keys come before the first table
    head, tables = (scheme.source[:table.start()], scheme.source[table.start():]) if table else (scheme.source, "")
    head, count = re.subn(r'(?m)^activation\s*=\s*"[a-z-]+"[ \t]*(?:#.*)?$', line, head, count=1)
    if not count:
        head = re.sub(r'(?m)^(name = ".*")$', lambda match: f"{match.group(1)}\n{line}", head, count=1)
    source = head + tables
    if parse_scheme(source).fingerprint != scheme.fingerprint:  # the same computation, or refused
        raise SplitformerError(f"cannot write the activation of {scheme.name!r} into its file")
    return source


def _derive(arguments: argparse.Namespace) -> str:
    from splitformer.symbolic.builtins import builtin_names

    from splitformer.symbolic.network_spec import network_names
    from splitformer.symbolic.scheme import Scheme

    from .output import as_folder, check_writable, write_files
    from .parallel import ordered_map
    from .passes import select
    from .pipeline import BACKEND_CHOICES, generate, generate_network

    names = list(arguments.schemes) + (builtin_names() + network_names() if arguments.all_builtins else [])
    if not names:
        raise SplitformerError("derive: name at least one SCHEME (or pass --all-builtins)")
    if arguments.name is not None and len(names) > 1:
        raise SplitformerError(f"--name names one module: give one SCHEME, not {len(names)}")
    passes = select(arguments.passes)
    out = as_folder(arguments.out, "--out")
    try:
        check_writable(out, f"--out {out}")
        unwritable = None
    except SplitformerError as error:  # refused below unless every module is there to be compared with
        unwritable = error
    # module name → (argument, scheme or model, identity); the same scheme or model twice is one, in any order
    emitted: dict[str, tuple[str, object, tuple]] = {}
    for name in names:
        item = _load_any(name, arguments)
        if isinstance(item, Scheme):
            item = _variant(item, arguments.causal, arguments.name)
            identity = ("scheme", item.source)
        else:
            identity = ("network", repr(item))
        module = item.module_name
        first, _, known = emitted.setdefault(module, (name, item, identity))
        if known != identity:
            raise SplitformerError(f"{first!r} and {name!r} would both be written as {module}.py; "
                                   "derive them into different --out folders")
    backends = BACKEND_CHOICES[arguments.backend]
    if unwritable is not None and not all((out / backend / f"{module}.py").is_file()
                                          for module in emitted for backend in backends):
        raise unwritable  # before any derivation: it could not be written
    # a read-only --out (a checked-out tree) whose files are all up to date derives to "unchanged"; a file that
    # changed is refused by write_files in one line

    def generated(item: tuple[str, object, tuple]) -> dict[Path, str]:
        _, scheme, _ = item
        return (generate if isinstance(scheme, Scheme) else generate_network)(scheme, backends, out, passes)

    files: dict[Path, str] = {}
    for part in ordered_map(generated, list(emitted.values())):  # in order, whichever worker derived it
        files.update(part)
    outcome = write_files(files, force=arguments.force, root=out)
    return "\n".join(_OUTCOME_LINES[action].format(path=_printable(str(path))) for path, action in outcome.items()
                     if path.name != "__init__.py" or action == "kept")


#: What ``derive`` prints per file, by what ``write_files`` did with it.
_OUTCOME_LINES = {
    "wrote": "wrote {path}",
    "unchanged": "unchanged {path} (already up to date)",
    "kept": "kept {path} (not written by splitformer; the package imports with it as it is)",
}


def _check(arguments: argparse.Namespace) -> tuple[str, int]:
    from splitformer.symbolic.builtins import builtin_names

    from .verification.groups import check_groups, require_checks
    from .verification.runner import run_checks
    from .verification.statements import SKIPPED

    from splitformer.symbolic.network_spec import load_scheme_or_network, network_names
    from splitformer.symbolic.scheme import Scheme

    only = check_groups(arguments.only, "--only")
    names = arguments.schemes or builtin_names() + network_names()
    items = {name: load_scheme_or_network(name) for name in names}
    schemes = [item for item in items.values() if isinstance(item, Scheme)]
    plots = None
    if arguments.plots is not None:
        if "convergence" not in only:
            raise SplitformerError("--plots: the plots are the convergence study's; add 'convergence' to --only")
        if not arguments.plots:  # Path("") is ".": plots would land in the current folder unasked
            raise SplitformerError("--plots: empty folder name (use '.' for the current folder)")
        plots = Path(arguments.plots)
        try:
            existing = next(folder for folder in (plots, *plots.parents) if folder.exists())
        except (OSError, ValueError) as error:
            raise SplitformerError(f"--plots {plots}: {getattr(error, 'strerror', None) or error}") from None
        if not existing.is_dir():
            raise SplitformerError(f"--plots {plots}: {existing} exists and is not a folder")
        from .output import check_replaceable, check_writable

        for target in [plots / f"{scheme.module_name}_convergence.png" for scheme in schemes] + [plots / "convergence.png"]:
            check_replaceable(target, hint="remove it or choose another --plots folder")
        check_writable(plots, f"--plots {plots}")
        _require_matplotlib("--plots")
    networks = [item for item in items.values() if not isinstance(item, Scheme)]
    report = require_checks(run_checks(schemes, plots, _progress_printer() if sys.stderr.isatty() else None, networks,
                                       only), only, names, "--only")
    text = {"text": report.as_text, "json": report.as_json, "markdown": report.as_markdown}[arguments.format]()
    if report.checks and all(check.method == SKIPPED for check in report.checks):  # a success that proved nothing
        _error("nothing was checked: every selected check was skipped (the report says why)")
        return text, 2
    return text, 0 if report.holds else 1


def _require_matplotlib(option: str) -> None:
    try:
        import matplotlib  # noqa: F401 - only whether it is installed
    except ImportError:
        raise SplitformerError(f"{option} needs matplotlib: pip install 'splitformer[plots]'") from None


def _progress_printer():
    """One line per check on stderr as it completes, with the time since the start."""
    import time

    start = time.monotonic()

    def show(check) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {check.label}  {check.id}", file=sys.stderr, flush=True)

    return show


def _sizes(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    from .compare import SIZE_NAMES

    sizes = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() not in SIZE_NAMES or not (value.strip().isascii() and value.strip().isdigit()) or \
                not 1 <= int(value) <= 2**31:
            raise SplitformerError(f"--sizes: expected NAME=N,… (NAME among {', '.join(SIZE_NAMES)}) with positive "
                                   f"integers up to 2**31, got {item[:40]!r}")
        if name.strip() in sizes:
            raise SplitformerError(f"--sizes: {name.strip()} is given twice")
        sizes[name.strip()] = int(value)
    return sizes


def _compare(arguments: argparse.Namespace) -> str:
    from .compare import compare

    sizes = _sizes(arguments.sizes)
    if arguments.plot is not None:
        from .output import check_replaceable, check_writable

        if not arguments.plot:  # Path("") is "."
            raise SplitformerError("--plot: empty file name (the plot is a PNG image; name it *.png)")
        plot = Path(arguments.plot)
        if plot.suffix.lower() != ".png":
            raise SplitformerError(f"--plot {plot}: the plot is a PNG image; name it *.png")
        check_replaceable(plot, hint="remove it or choose another --plot file")
        check_writable(plot.parent, f"--plot {plot}")
        _require_matplotlib("--plot")
    table = compare([_load(name, None) for name in arguments.schemes], arguments.activation, sizes)
    if arguments.plot is not None:
        _stderr_line(f"wrote {table.plot(Path(arguments.plot))}")  # stdout holds the table alone (a LaTeX file)
    return {"text": table.as_text, "markdown": table.as_markdown, "latex": table.as_latex}[arguments.format]()


def _study_command(commands) -> None:
    from .study import TASKS, Budget

    default = Budget()
    study = _command(commands, "study", "train variants at a matched parameter count and compare them",
                     "Train each SCHEME from --seeds seeds for --steps steps, every variant at the parameter\n"
                     "count of the first (its feed-forward width adjusted), on data that needs no download:\n"
                     "chars, next-character prediction on the Python standard library's own source files, and\n"
                     "mqar, multi-query associative recall generated on the fly, train the scheme made causal\n"
                     "as a language model (splitformer.nn.LanguageModel); digits, scikit-learn's 8×8 digit\n"
                     "images, trains a splitformer.nn.Classifier over the scheme's stack. Writes OUT/study.md,\n"
                     "OUT/study.json and OUT/loss.png; prints the table. One progress line per run goes to stderr.\n"
                     "Each run is kept in OUT/runs/ as it ends: the same command after an interrupt trains only\n"
                     "the runs it had not finished, and one with a scheme added trains only that scheme's.")
    study.add_argument("schemes", nargs="+", metavar="SCHEME", help=_SCHEME)
    study.add_argument("--task", choices=TASKS, default="chars", help="chars (default), mqar, or digits (needs scikit-learn)")
    for name, help_text in (("steps", "optimizer steps per run"), ("seeds", "runs per scheme (seeds 0, 1, …)"),
                            ("d-model", "model width"), ("layers", "number of blocks"),
                            ("batch", "sequences per step"),
                            ("tokens", "sequence length of --task chars (mqar has 32, digits 16)"),
                            ("threads", "torch CPU threads while training")):
        field = "n_layers" if name == "layers" else name.replace("-", "_")
        study.add_argument(f"--{name}", type=int, default=None, dest=field, metavar="N",
                           help=f"{help_text} (default {getattr(default, field)})")
    study.add_argument("--lr", type=float, default=None, metavar="RATE",
                       help=f"AdamW's peak learning rate, in (0, 1] (default {default.lr:g}): a linear warm-up to it "
                            "over min(20, steps/10) steps, then a cosine decay")
    study.add_argument("--out", default="study", metavar="DIR", help="output folder (default: study)")
    study.add_argument("--force", action="store_true",
                       help="replace study files in DIR that splitformer did not write")
    _load_option(study)


def _study(arguments: argparse.Namespace) -> str:
    from .output import as_folder, check_files, check_writable, held_alone
    from .study import FILES, RUNS, SEQUENCES, Budget, study
    from .study_runs import RunStore

    out = as_folder(arguments.out, "--out")
    check_files([out / name for name in FILES], force=arguments.force, root=out, changing=True)  # before training
    check_writable(out, "--out")
    _require_matplotlib("study")
    from .verification.emitted import torch_installed

    if not torch_installed():
        raise SplitformerError("study needs PyTorch: pip install 'splitformer[torch]'")
    if arguments.tokens is not None and arguments.task in SEQUENCES:
        raise SplitformerError(f"--tokens sets the sequence length of --task chars; {arguments.task} has "
                               f"{SEQUENCES[arguments.task]} tokens")
    given = {name: getattr(arguments, name) for name in ("steps", "seeds", "d_model", "n_layers", "batch", "tokens",
                                                         "threads", "lr")}
    budget = Budget(**{name: value for name, value in given.items() if value is not None})
    runs = RunStore(out / RUNS, arguments.task, root=out, force=arguments.force)
    with held_alone(out, "--out"):  # two studies in one folder: the second is refused, not interleaved with the first
        try:
            result = study(arguments.schemes, arguments.task, budget, runs=runs)
        except KeyboardInterrupt:
            if runs.finished:
                _clear_progress_line()
                many = len(runs.finished) > 1
                _stderr_line(f"{len(runs.finished)} finished run{'s' * many} kept in {runs.folder}: the same command "
                             f"takes {'them' if many else 'it'} up")
            raise
        paths = result.write(out, force=arguments.force)
    _stderr_line("wrote " + ", ".join(str(path) for path in paths))  # stdout holds the table alone, as compare's
    return result.as_markdown()


def _schemes_after_options(extras: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The schemes argparse left after an option (``derive post-ln --out o pre-ln``; after ``--``, anything): each a
    built-in name or a file (``.toml``), so that an option's second value (``--only order convergence``) is not read as
    one."""
    from splitformer.symbolic.builtins import builtin_names
    from splitformer.symbolic.network_spec import network_names

    split = extras.index("--") if "--" in extras else len(extras)
    before, after = extras[:split], extras[split + 1:]
    known = set(builtin_names()) | set(network_names())
    stray = [extra for extra in before
             if extra.startswith("-") or not (extra in known or extra.endswith(".toml") or Path(extra).exists())]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)} (after an option, a scheme is a built-in name or "
                     "a file)")
    return before + after


def _run(argv: list[str] | None) -> tuple[str, int]:
    parser = _parser()
    arguments, extras = parser.parse_known_args(argv)
    if extras:
        if not isinstance(getattr(arguments, "schemes", None), list):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        arguments.schemes += _schemes_after_options(extras, parser)
    with contextlib.redirect_stdout(_ToStderr()):
        return _dispatch(arguments, parser)


class _ToStderr(io.TextIOBase):
    """``sys.stdout`` while a command runs: what plug-in code prints goes to stderr, and stdout carries the command's
    text alone (a plug-in's print broke the JSON of ``check --format json``, a tester found). Closing it closes
    nothing else."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if sys.stderr is not None:
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        if sys.stderr is not None:
            sys.stderr.flush()


def _dispatch(arguments: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, int]:
    """The parsed command's text for stdout and its exit status."""
    if getattr(arguments, "load", None):
        from splitformer.symbolic.plugins import PluginError, load_plugins

        try:
            load_plugins(arguments.load)
        except PluginError as error:
            raise SplitformerError(f"--load {error.path}: {error.reason}") from None
    if arguments.command is None:  # bare `splitformer`: the usage, not an error
        return parser.format_help().rstrip("\n"), 0
    if arguments.command == "list":
        return _list(), 0
    if arguments.command == "show":
        return _show(arguments), 0
    if arguments.command == "check":
        return _check(arguments)
    if arguments.command == "compare":
        return _compare(arguments), 0
    if arguments.command == "study":
        return _study(arguments), 0
    return _derive(arguments), 0


def _error(message: str) -> None:
    """``error: message`` on stderr (``_stderr_line``)."""
    _stderr_line(f"error: {message}")


def _printable(text: str) -> str:
    """``text`` with each character that is not printable (a new line, a terminal's escape sequence from a data file's
    text or a folder's name) written as its escape: one line, whatever it holds."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def _stderr_line(message: str) -> None:
    """One line on stderr, whatever the message holds (``_printable``)."""
    line = _printable(message)
    if sys.stderr is None:  # started with it closed (2>&-): print(file=None) would write to stdout
        return
    try:
        print(line, file=sys.stderr)
    except OSError:
        pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        target = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, target)
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # not a real file (tests, IDEs): nothing to flush later
        pass


def _ignore_interrupts() -> None:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: the interpreter delivers no KeyboardInterrupt here
        pass


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``) while the command runs, unwound as an interrupt is: the files being staged are
    removed (by default SIGTERM ended the process at once, leaving ``.splitformer-*.tmp`` files and new folders)."""


def _terminate(number: int, frame) -> NoReturn:
    raise _Terminated


def _catch_termination() -> None:
    """Unwind SIGTERM as ``_Terminated`` (main thread only: elsewhere no handler can be set)."""
    try:
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:
        pass


def _clear_progress_line() -> None:
    """On a terminal, erase a progress line left open (``study``'s end in a carriage return), so that a message
    after it does not mix with its end."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            sys.stderr.write("\r\033[K")
    except (OSError, ValueError):  # closed: nothing to clear
        pass


def _end_interrupted(terminated: bool = False) -> NoReturn:
    """End this process, the command, after an interrupt: one line and status 130 (after SIGTERM: 143), never death
    by the signal.

    Further SIGINTs are ignored first: a second Ctrl-C (or a SIGINT to the process group) would
    otherwise escape from the message as a traceback. The process then ends at once, without the
    interpreter's shutdown: CPython (3.11) notes a KeyboardInterrupt that left any ``exec`` of a
    string (a dataclass's generated methods, a lambdified function) as unhandled, even when this
    function caught it, and ``python -m splitformer`` would end by re-raising SIGINT with the
    default disposition (status -2). Nothing is left to clean up: the jobs were dropped, the
    files written whole or not at all, and the streams are flushed here.
    """
    _ignore_interrupts()
    _clear_progress_line()
    _error("terminated" if terminated else "interrupted")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or the reader left: nothing more to say
            pass
    os._exit(143 if terminated else 130)


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``argv`` None: this process's own, it ends with the command); returns the exit status."""
    if argv is None:
        _catch_termination()
    try:
        text, status = _run(argv)
        try:
            print(text)
            if sys.stdout is not None:  # None: started with its stdout closed (>&-); print wrote nothing
                sys.stdout.flush()
        except BrokenPipeError:  # the reader left (| head -1): stop quietly
            _silence_stdout()
            return 141
        except OSError as error:
            _silence_stdout()
            raise SplitformerError(f"cannot write to standard output: {error.strerror or error}") from None
    except SplitformerError as error:
        _error(str(error))
        return 2
    except MemoryError:  # a limit (ulimit -v, a container's) met while deriving: the files are written whole or not at all
        _error("out of memory (files are written whole or not at all)")
        return 2
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, _Terminated)
        if argv is None:  # the process is the command, not a caller's in-process run
            _end_interrupted(terminated)
        _clear_progress_line()
        _error("terminated" if terminated else "interrupted")
        return 143 if terminated else 130
    return status


def console() -> NoReturn:
    """The ``splitformer`` command (its console script, ``python -m splitformer``): ``main`` on this process's
    arguments, then its status. Once the command has said its result, a Ctrl-C changes nothing (it ended the
    process by SIGINT, silently, after every "wrote" line); a caller of ``main`` keeps its own Ctrl-C."""
    status = main()
    _ignore_interrupts()
    sys.exit(status)


if __name__ == "__main__":
    console()

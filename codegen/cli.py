"""The ``splitformer`` command line: list, show, derive (and check, see ``--help``).

Bad input ends in one ``error: …`` line on stderr and exit status 2, with nothing written.
An interrupt (Ctrl-C) ends in one line and status 130; a reader that closes the pipe early
(``splitformer check | head -1``) ends the command quietly with status 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from splitformer.symbolic import __version__
from splitformer.symbolic.errors import SplitformerError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise SplitformerError(message)


def _load_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--load", action="append", default=[], metavar="FILE.py",
                         help="import a Python file first: the operator kinds, projections and Runge–Kutta "
                              "tableaux it registers become usable by name in scheme files (repeatable)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="splitformer", description="Derive Transformer blocks as operator-splitting schemes.")
    parser.add_argument("--version", action="version", version=f"splitformer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("list", help="built-in schemes, one a line: name, summary")
    show = commands.add_parser("show", help="print a scheme and its derivation")
    show.add_argument("scheme", help="built-in name or path to a scheme file (TOML)")
    show.add_argument("--format", choices=("text", "latex", "markdown", "toml"), default="text")
    show.add_argument("--activation", default=None, help="relu (default), gelu, silu or tanh")
    _load_option(show)
    derive = commands.add_parser("derive", help="derive schemes and emit code and reports")
    derive.add_argument("schemes", nargs="*", metavar="SCHEME", help="built-in names or scheme files")
    derive.add_argument("--all-builtins", action="store_true", help="derive every built-in scheme")
    derive.add_argument("--backend", choices=("numpy", "torch", "all"), default="all")
    derive.add_argument("--out", default="generated", help="output folder (default: generated)")
    derive.add_argument("--force", action="store_true",
                        help="overwrite files in --out that splitformer did not write")
    derive.add_argument("--activation", default=None, help="relu (default), gelu, silu or tanh")
    derive.add_argument("--passes", default="all", metavar="LIST",
                        help="IR passes to run: all (default), none, or a comma-separated list of pass names")
    _load_option(derive)
    check = commands.add_parser("check", help="proof checks; exit 0 when all hold, 1 when one fails")
    check.add_argument("schemes", nargs="*", metavar="SCHEME", help="built-in names or scheme files (default: all built-ins)")
    check.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    check.add_argument("--plots", default=None, metavar="DIR", help="write a convergence plot (PNG) per scheme")
    _load_option(check)
    return parser


def _load(name: str, activation: str | None):
    from splitformer.symbolic.scheme_file import load_scheme

    scheme = load_scheme(name)
    return scheme if activation is None else scheme.with_activation(activation)


def _list() -> str:
    from splitformer.symbolic.builtins import builtin_names, builtin_summary

    names = builtin_names()
    width = max(len(name) for name in names)
    return "\n".join(f"{name:<{width}}  {builtin_summary(name)}" for name in names)


def _show(arguments: argparse.Namespace) -> str:
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.equation import equation_latex

    scheme = _load(arguments.scheme, arguments.activation)
    if arguments.format == "toml":
        return _source_with_activation(scheme).rstrip("\n")
    program = derive(scheme)
    if arguments.format == "markdown":
        from .report import render_report

        return render_report(scheme, program).rstrip("\n")
    if arguments.format == "latex":
        lines = [equation_latex(scheme)]
        for record in program.records:
            lines.append(f"% {record.title}")
            lines.extend(assignment.quadrature for assignment in record.assignments)
        return "\n".join(lines)
    lines = [f"{scheme.name}: {scheme.summary}", f"activation: {scheme.activation}", ""]
    for record in program.records:
        lines.append(f"{record.title}")
        lines.extend(f"    {assignment.lhs} = {assignment.rhs}" for assignment in record.assignments)
    return "\n".join(lines)


def _source_with_activation(scheme) -> str:
    """The scheme file, its ``activation`` line set to the scheme's (``--activation``)."""
    import re

    from splitformer.symbolic.scheme_file import parse_scheme

    line = f'activation = "{scheme.activation}"'
    source, count = re.subn(r'(?m)^activation = "[a-z]+"$', line, scheme.source, count=1)
    if not count:
        source = re.sub(r'(?m)^(name = ".*")$', lambda match: f"{match.group(1)}\n{line}", source, count=1)
    if parse_scheme(source).activation != scheme.activation:
        raise SplitformerError(f"cannot write the activation of {scheme.name!r} into its file")
    return source


def _derive(arguments: argparse.Namespace) -> str:
    from splitformer.symbolic.builtins import builtin_names

    from .output import write_files
    from .passes import select
    from .pipeline import BACKEND_CHOICES, generate

    names = list(arguments.schemes) + (builtin_names() if arguments.all_builtins else [])
    if not names:
        raise SplitformerError("derive: name at least one SCHEME (or pass --all-builtins)")
    passes = select(arguments.passes)
    if not arguments.out:
        raise SplitformerError("--out: empty folder name (use --out . for the current folder)")
    out = Path(arguments.out)
    emitted: dict[str, tuple[str, object]] = {}  # module name → (argument, scheme); the same scheme twice is one
    for name in names:
        scheme = _load(name, arguments.activation)
        first, previous = emitted.setdefault(scheme.module_name, (name, scheme))
        if previous is not scheme and previous.source != scheme.source:
            raise SplitformerError(f"schemes {first!r} and {name!r} would both be written as "
                                   f"{scheme.module_name}.py; derive them into different --out folders")
    files: dict[Path, str] = {}
    for _, scheme in emitted.values():
        files.update(generate(scheme, BACKEND_CHOICES[arguments.backend], out, passes))
    write_files(files, force=arguments.force)
    return "\n".join(f"wrote {path}" for path in files if not path.name == "__init__.py")


def _check(arguments: argparse.Namespace) -> tuple[str, int]:
    from splitformer.symbolic.builtins import builtin_names

    from .checking import run_checks

    schemes = [_load(name, None) for name in (arguments.schemes or builtin_names())]
    plots = None
    if arguments.plots is not None:
        plots = Path(arguments.plots)
        try:
            existing = next(folder for folder in (plots, *plots.parents) if folder.exists())
        except (OSError, ValueError) as error:
            raise SplitformerError(f"--plots {plots}: {getattr(error, 'strerror', None) or error}") from None
        if not existing.is_dir():
            raise SplitformerError(f"--plots {plots}: {existing} exists and is not a folder")
        from .output import check_target

        for scheme in schemes:
            check_target(plots / f"{scheme.module_name}_convergence.png")
        try:
            import matplotlib  # noqa: F401 - only whether it is installed
        except ImportError:
            raise SplitformerError("--plots needs matplotlib: pip install 'splitformer[plots]'") from None
    report = run_checks(schemes, plots)
    text = {"text": report.as_text, "json": report.as_json, "markdown": report.as_markdown}[arguments.format]()
    return text, 0 if report.holds else 1


def _run(argv: list[str] | None) -> tuple[str, int]:
    arguments = _parser().parse_args(argv)
    if getattr(arguments, "load", None):
        from splitformer.symbolic.plugins import load_plugins

        load_plugins(arguments.load)
    if arguments.command == "list":
        return _list(), 0
    if arguments.command == "show":
        return _show(arguments), 0
    if arguments.command == "check":
        return _check(arguments)
    return _derive(arguments), 0


def _error(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    try:
        print(f"error: {message}".replace("\n", "\\n").replace("\r", "\\r"), file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        text, status = _run(argv)
        try:
            print(text)
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
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

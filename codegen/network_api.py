"""The Python API of a derived network (``splitformer.derive("vit")``, or a network file).

``NetworkDerivation`` mirrors ``Derivation`` for networks: the generated modules in memory,
the files ``splitformer derive`` writes, the report and the checks ``splitformer check``
runs on a network::

    import splitformer

    network = splitformer.derive("vit")
    logits = network.numpy_module().logits
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from splitformer.symbolic.markdown import inert, markdown_text
from splitformer.symbolic.network_spec import NetworkSpec, check_network

from .derivations import GeneratedModules, check_passes, check_write_options
from .output import as_folder, write_files
from .pipeline import BACKEND_CHOICES, generate_network

__all__ = ["NetworkDerivation"]


@dataclass
class NetworkDerivation(GeneratedModules):
    """A derived network: its generated modules and report."""

    spec: NetworkSpec
    passes: tuple | None = None
    _modules: dict[str, types.ModuleType] = field(default_factory=dict, init=False, repr=False)

    SEALED = ("spec", "passes")

    def __post_init__(self) -> None:
        check_network(self.spec)  # a spec object, however made or edited, is checked as its file is
        check_passes(self.passes, "NetworkDerivation")
        self._seal()

    @property
    def title(self) -> str:
        """The network's name (``vit``)."""
        return self.spec.name

    @property
    def name(self) -> str:
        """The module name of the generated code (``vit``)."""
        return self.spec.module_name

    @cached_property
    def _files(self) -> dict[Path, str]:
        self._unchanged()
        return generate_network(self.spec, ("numpy", "torch"), Path("."), self.passes)

    @property
    def report(self) -> str:
        """The derivation report (Markdown), as ``splitformer derive`` writes it."""
        self._unchanged()
        return self._files[Path("reports") / f"{self.name}.md"]

    def _source(self, backend: str) -> str:
        return self._files[Path(backend) / f"{self.name}.py"]

    def write(self, out: str | Path = "generated", backend: str = "all", force: bool = False) -> list[Path]:
        """Write the modules and the report under ``out`` (all or nothing); returns the paths."""
        check_write_options(backend, force)
        self._unchanged()
        out = as_folder(out, "out")
        files = generate_network(self.spec, BACKEND_CHOICES[backend], out, self.passes)
        write_files(files, force=force, root=out)
        return list(files)

    def check(self, only: str | Iterable[str] | None = None):
        """The network's checks, as ``splitformer check <network>`` runs them, as a ``CheckReport``; ``only`` names
        the groups to run (``splitformer check --only``)."""
        from .verification.groups import check_groups, require_checks
        from .verification.runner import network_checks

        only = check_groups(only)
        self._unchanged()
        return require_checks(network_checks(self.spec, only=only), only, [self.spec.name])

    def __repr__(self) -> str:
        return f"<NetworkDerivation of {self.spec.name!r} → {self.name}>"

    def _repr_markdown_(self) -> str:
        """A notebook's view: the network, its summary and the sections of its report (as a ``Derivation`` shows its
        substeps)."""
        sections = [line.removeprefix("## ") for line in self.report.splitlines() if line.startswith("## ")]
        lines = [f"**Network `{self.spec.name}`** → `{self.name}`: {markdown_text(self.spec.summary)}", "",
                 f"{len(sections)} sections of its report (`.report`; `.check()` runs its checks):", ""]
        lines += sections  # "1. One step …": an ordered list as they are
        return inert("\n".join(lines), f"the view of {self.spec.name!r}")

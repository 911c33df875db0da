"""A study's runs, each kept on disk as it ends, so that the same study after an interrupt trains only the rest.

``splitformer study --out DIR`` keeps each finished run (one variant from one seed) in ``DIR/runs/NAME-seedK.json``
with the key of what it was computed from: the emitted module's source, the task, the budget, the variant's
feed-forward width, the seed, the versions of splitformer, Python, NumPy and torch (and scikit-learn, whose images
the digits task reads), the source of the code that builds and trains a variant, and torch's default dtype. A later
study takes a kept run up where every one of them is the same (the numbers it would compute again, as training from
a seed on one thread is deterministic) and trains where any differs, or where the file is not a whole run of that key.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from splitformer.symbolic import __version__

from .output import JSON_GENERATOR, check_files, check_writable, write_files

__all__ = ["Run", "RunStore", "json_numbers", "run_key"]


@dataclass
class Run:
    """One variant from one seed: curves and final numbers."""

    train_loss: list[float] = field(default_factory=list)
    valid_steps: list[int] = field(default_factory=list)
    valid_loss: list[float] = field(default_factory=list)
    valid_accuracy: float | None = None
    step_time: float = 0.0


def json_numbers(value):
    """``value`` with every float that is not finite as None (``null``: JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_numbers(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_numbers(item) for item in value]
    return value


def run_key(module, task: str, budget, d_ff: int, seed: int, training: str) -> str | None:
    """The digest of what a run computes from (``training``: the source of the code that builds and trains it); None
    where the module's source cannot be read (one built in memory by hand and passed in), whose runs are not kept."""
    import torch

    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    versions = [__version__, platform.python_version(), np.__version__, torch.__version__]
    if task == "digits":  # its images are scikit-learn's
        import sklearn

        versions.append(sklearn.__version__)
    sizes = {name: value for name, value in asdict(budget).items() if name != "seeds"}  # a run is one seed's: more
    # seeds (--seeds 3 after 2) take up the runs kept
    fields = {"source": source, "task": task, "budget": sizes, "d_ff": d_ff, "seed": seed,
              "versions": versions, "training": training, "default_dtype": str(torch.get_default_dtype())}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()


def _number(value) -> float:
    """A kept loss or time: a JSON number, or null for one that was not finite (a diverged run's NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _run_from_json(data: dict, steps: int) -> Run:
    """The ``Run`` a kept file holds; TypeError, ValueError or KeyError where it is not a whole run of ``steps``."""
    valid_steps = data["valid_steps"]
    if not (isinstance(valid_steps, list) and valid_steps and valid_steps[-1] == steps
            and all(type(step) is int for step in valid_steps) and valid_steps == sorted(set(valid_steps))):
        raise ValueError("validation steps")
    run = Run([_number(value) for value in data["train_loss"]], valid_steps,
              [_number(value) for value in data["valid_loss"]],
              None if data["valid_accuracy"] is None else _number(data["valid_accuracy"]), _number(data["step_time"]))
    if len(run.train_loss) != steps or len(run.valid_loss) != len(valid_steps):
        raise ValueError("lengths")
    return run


class RunStore:
    """The folder of a study's kept runs, inside ``root`` (the folder itself unless given: a study's ``--out``, where
    a symbolic link may not lead out), ``force`` replacing files splitformer did not write, as the study's own."""

    def __init__(self, folder: Path, task: str, *, root: Path | None = None, force: bool = False):
        self.folder, self.task, self.root, self.force = folder, task, folder if root is None else root, force
        #: The runs of this study kept or taken up so far.
        self.finished: list[Path] = []

    def path(self, name: str, seed: int) -> Path:
        return self.folder / f"{name}-seed{seed}.json"

    def check(self, names: list[str], seeds: int) -> None:
        """Refuse, before any training, what keeping a run would refuse: a file in its way that splitformer did not
        write (unless ``force``), a symbolic link out of ``root``, a folder no file can be written in (a run trained,
        then lost)."""
        check_files([self.path(name, seed) for name in names for seed in range(seeds)], force=self.force,
                    root=self.root, changing=True)
        check_writable(self.folder, "runs")

    def taken_up(self, name: str, seed: int, key: str | None, steps: int) -> Run | None:
        """The run kept for ``name`` and ``seed`` under ``key``; None where there is none."""
        if key is None:
            return None
        try:
            data = json.loads(self.path(name, seed).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("key") != key:
                return None
            run = _run_from_json(data["run"], steps)
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
            return None
        self.finished.append(self.path(name, seed))
        return run

    def keep(self, name: str, seed: int, key: str | None, run: Run) -> None:
        """Write ``run`` whole (or not at all) as the kept run of ``name`` and ``seed``."""
        if key is None:
            return
        header = f"Generated by splitformer {__version__} from the study `{self.task}`; do not edit."
        text = json.dumps({JSON_GENERATOR: header, "scheme": name, "seed": seed, "key": key,
                           "run": json_numbers(asdict(run))}, indent=1, allow_nan=False) + "\n"
        write_files({self.path(name, seed): text}, force=self.force, root=self.root)
        self.finished.append(self.path(name, seed))

"""``splitformer study``: train variants side by side at a matched parameter count.

Each scheme becomes a ``LanguageModel`` (``splitformer.nn``; a ``Classifier`` for images) whose feed-forward width is
chosen so that every variant has the parameter count of the first one (within a few %);
each is trained for ``steps`` AdamW steps from ``seeds`` seeds on a task that needs no
download:

- ``chars``: next-character prediction on the Python standard library's own source files
  (a fixed seeded selection of the ``.py`` files beside ``os.py``, read at run time), the
  last tenth of the text held out;
- ``mqar``: multi-query associative recall (Zoology, Arora et al. 2023), generated on the
  fly: key–value pairs, then queried keys, each to be followed by its value;
- ``digits``: scikit-learn's 8×8 digit images (if scikit-learn is installed) classified by a
  ``Classifier`` over the non-causal stack, one fifth held out.

The result is a table (final train and validation loss, accuracy for ``mqar`` and ``digits``, mean ± spread
over seeds, step time, parameters) as markdown and JSON, and loss-curve plots.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import numbers
import os
import statistics
import sys
import time
import types
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from splitformer.symbolic import __version__
from splitformer.symbolic.builtins import builtin_names
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.markdown import inert
from splitformer.symbolic.names import check_distinct
from splitformer.symbolic.operators import OPERATOR_KINDS
from splitformer.symbolic.plugins import plugin_file
from splitformer.symbolic.scheme import Scheme

from .output import JSON_GENERATOR, as_folder, check_replaceable, write_files
from .study_runs import Run, RunStore, json_numbers, run_key

__all__ = ["Budget", "Study", "study", "TASKS", "FILES", "RUNS", "SEQUENCES"]

TASKS = ("chars", "mqar", "digits")
#: What ``Study.write(out)`` and ``splitformer study --out`` write into the folder.
FILES = ("study.md", "study.json", "loss.png")
#: The folder of ``--out`` where ``splitformer study`` keeps each run as it ends (``study(runs=…)``).
RUNS = "runs"
_ASCII = 128  # character vocabulary: ASCII, anything else read as '?'
_WARM_UP = 20  # the most steps over which the learning rate rises linearly (a tenth of a shorter run's)
_MQAR_KEYS, _MQAR_VALUES, _MQAR_PAIRS, _MQAR_QUERIES = 32, 32, 8, 8


def _option(field: str) -> str:
    """The ``splitformer study`` option that sets ``field`` (``n_layers`` → ``layers``)."""
    return {"n_layers": "layers", "n_heads": "heads", "d_ff": "d-ff", "eval_batches": "eval-batches"}.get(
        field, field.replace("_", "-"))


#: The largest value of each study option, and of any array a run holds (in numbers): a study runs on one machine.
_LIMITS = {"steps": 10**7, "seeds": 1000, "d_model": 16384, "n_heads": 1024, "n_layers": 1024, "d_ff": 65536,
           "batch": 65536, "tokens": 65536, "eval_batches": 10**5, "threads": 1024}
_MOST_NUMBERS = 2**28


@dataclass(frozen=True)
class Budget:
    """Sizes of one study: model, batch, sequence, optimizer."""

    steps: int = 300
    seeds: int = 3
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128  # of the first scheme; the others get the width that matches its parameter count
    batch: int = 16
    tokens: int = 64  # of the chars task; mqar and digits have their own (32, 16)
    lr: float = 3e-3
    eval_batches: int = 4
    threads: int = 1  # torch's CPU threads while training: one is steady on a shared machine and reproducible

    def __post_init__(self) -> None:
        if isinstance(self.lr, numbers.Real) and not isinstance(self.lr, bool):  # a Fraction, NumPy's float32: as float
            object.__setattr__(self, "lr", float(self.lr))
        for entry in fields(self):  # NumPy's integers (np.int64(3)) as int
            value = getattr(self, entry.name)
            if entry.type == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, entry.name, int(value))

    def check(self) -> None:
        for name in ("steps", "seeds", "d_model", "n_heads", "n_layers", "d_ff", "batch", "tokens", "eval_batches",
                     "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SplitformerError(f"{_option(name)} must be a positive integer, got {value!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, numbers.Real) or not 0 < self.lr <= 1:
            raise SplitformerError(f"lr must be a real number in (0, 1], got {self.lr!r}")
        if self.d_model % self.n_heads:
            raise SplitformerError(f"d-model = {self.d_model} is not divisible by the {self.n_heads} heads of a study's "
                                   "blocks")
        for name, limit in _LIMITS.items():
            if getattr(self, name) > limit:
                raise SplitformerError(f"{_option(name)} = {getattr(self, name)} is above {limit}, the most a "
                                       "study on one machine takes")
        width = max(self.d_model, self.d_ff)
        for what, count in (("the weights (at least layers × d-model × max(d-model, d-ff))", self.n_layers * self.d_model * width),
                            ("one activation (batch × tokens × max(d-model, d-ff))", self.batch * self.tokens * width),
                            ("the attention scores (batch × n-heads × tokens²)", self.batch * self.n_heads * self.tokens ** 2)):
            if count > _MOST_NUMBERS:
                raise SplitformerError(f"{what} would hold {count:,} numbers, more than {_MOST_NUMBERS:,} (1 GiB in "
                                       "float32): lower those sizes")


def _check_parameters(name: str, count: int) -> None:
    """Refuse a variant of more than ``_MOST_NUMBERS`` parameters (its weights 1 GiB in float32, training 4: the
    gradients and AdamW's two moments)."""
    if count > _MOST_NUMBERS:
        raise SplitformerError(f"{name}: {count:,} parameters, more than {_MOST_NUMBERS:,} (1 GiB of float32 weights; "
                               "training holds 4 GiB with the gradients and AdamW's moments): lower d-model or layers "
                               "(or Budget.d_ff)")


# --- tasks ------------------------------------------------------------------------------------

def _stdlib_text(files: int = 24) -> str:
    """A fixed seeded selection of the standard library's top-level source files, as ASCII."""
    folder = Path(os.path.dirname(os.__file__))
    names = sorted(path.name for path in folder.glob("*.py"))
    if len(names) < files:
        raise SplitformerError(f"the standard library at {folder} has {len(names)} source files, fewer than {files}")
    chosen = np.random.default_rng(0).choice(len(names), files, replace=False)
    text = "".join((folder / names[index]).read_text(encoding="utf-8", errors="replace") for index in sorted(chosen))
    return text


class _Task:
    """A task: ``batch`` draws (inputs, targets); ``model`` builds a variant; targets −100 are not scored."""

    metric = None

    def module(self, scheme):
        """The emitted torch module the task trains: the scheme made causal, with its KV cache."""
        from .nn import stack_module

        return stack_module(scheme, causal=True)

    def model(self, module, budget: Budget, d_ff: int, device=None):
        from .nn import LanguageModel

        return LanguageModel(module, self.vocab, d_model=budget.d_model, n_heads=budget.n_heads, d_ff=d_ff,
                             n_layers=budget.n_layers, max_tokens=self.sequence, device=device)

    def evaluation(self, budget: Budget, seed: int):
        """The validation batches: ``eval_batches`` drawn from a generator of their own."""
        rng = np.random.default_rng(10_000 + seed)
        return [self.batch(rng, budget.batch, valid=True) for _ in range(budget.eval_batches)]


class _Chars(_Task):
    """Next-character prediction on standard-library source; windows drawn at random."""

    vocab = _ASCII

    def __init__(self, tokens: int):
        codes = np.frombuffer(_stdlib_text().encode("ascii", errors="replace"), dtype=np.uint8).astype(np.int64)
        split = len(codes) * 9 // 10
        self.train, self.valid, self.sequence = codes[:split], codes[split:], tokens

    def batch(self, rng: np.random.Generator, size: int, valid: bool = False) -> tuple[np.ndarray, np.ndarray]:
        codes = self.valid if valid else self.train
        starts = rng.integers(0, len(codes) - self.sequence - 1, size)
        windows = np.stack([codes[start:start + self.sequence + 1] for start in starts])
        return windows[:, :-1], windows[:, 1:]


class _Recall(_Task):
    """MQAR: ``k₁ v₁ … k_P v_P q₁ a₁ … q_Q a_Q``; only the answers aᵢ = value of qᵢ are scored.

    Keys are tokens ``0 … K−1``, values ``K … K+V−1``; targets elsewhere are −100 (ignored).
    """

    vocab = _MQAR_KEYS + _MQAR_VALUES
    metric = "accuracy"
    sequence = 2 * (_MQAR_PAIRS + _MQAR_QUERIES)

    def batch(self, rng: np.random.Generator, size: int, valid: bool = False) -> tuple[np.ndarray, np.ndarray]:
        keys = np.stack([rng.choice(_MQAR_KEYS, _MQAR_PAIRS, replace=False) for _ in range(size)])
        values = rng.integers(_MQAR_KEYS, self.vocab, (size, _MQAR_PAIRS))
        asked = np.stack([rng.choice(_MQAR_PAIRS, _MQAR_QUERIES, replace=True) for _ in range(size)])
        rows = np.arange(size)[:, None]
        sequence = np.empty((size, self.sequence), dtype=np.int64)
        sequence[:, 0:2 * _MQAR_PAIRS:2], sequence[:, 1:2 * _MQAR_PAIRS:2] = keys, values
        sequence[:, 2 * _MQAR_PAIRS::2], sequence[:, 2 * _MQAR_PAIRS + 1::2] = keys[rows, asked], values[rows, asked]
        targets = np.full((size, self.sequence), -100, dtype=np.int64)
        targets[:, 2 * _MQAR_PAIRS::2] = values[rows, asked]
        return sequence, targets


class _Digits(_Task):
    """scikit-learn's 8×8 digits: 16 tokens of 2×2 pixels, a ``Classifier`` with mean pooling."""

    metric = "accuracy"
    sequence = 16

    def __init__(self):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise SplitformerError("the digits task needs scikit-learn: pip install scikit-learn") from None
        digits = load_digits()
        images = digits.images.reshape(-1, 4, 2, 4, 2).transpose(0, 1, 3, 2, 4).reshape(-1, 16, 4) / 16.0
        order = np.random.default_rng(0).permutation(len(images))
        split = len(images) * 4 // 5
        self.train = images[order[:split]].astype(np.float32), digits.target[order[:split]].astype(np.int64)
        self.valid = images[order[split:]].astype(np.float32), digits.target[order[split:]].astype(np.int64)

    def module(self, scheme):
        """A Classifier's: a scheme declaring ``causal = true`` is refused, as ``nn.Classifier`` refuses it (it
        attends both ways: gpt2 was trained so, silently)."""
        from .nn import encoder_module

        return encoder_module(scheme, "Classifier (study --task digits)")

    def model(self, module, budget: Budget, d_ff: int, device=None):
        from .nn import Classifier

        return Classifier(module, 10, d_input=4, d_model=budget.d_model, n_heads=budget.n_heads, d_ff=d_ff,
                          n_layers=budget.n_layers, max_tokens=self.sequence, device=device)

    def batch(self, rng: np.random.Generator, size: int, valid: bool = False) -> tuple[np.ndarray, np.ndarray]:
        images, labels = self.valid if valid else self.train
        chosen = rng.integers(0, len(labels), size)
        return images[chosen], labels[chosen]

    def evaluation(self, budget: Budget, seed: int):
        """The whole held-out fifth, once."""
        return [self.valid]


def _task(name: str, budget: Budget) -> _Task:
    return {"chars": lambda: _Chars(budget.tokens), "mqar": _Recall, "digits": _Digits}[name]()


#: The sequence length of each task other than chars (whose ``Budget.tokens`` sets it).
SEQUENCES = {"mqar": _Recall.sequence, "digits": _Digits.sequence}


# --- matched parameter counts -----------------------------------------------------------------

def _count(module, task: _Task, budget: Budget, d_ff: int) -> int:
    try:
        model = task.model(module, budget, d_ff, device="meta")
    except ValueError as error:  # sizes the scheme's Stack refuses (its heads too narrow for its rotary pairs)
        raise SplitformerError(f"{module.SCHEME}: {error} (d-model {budget.d_model} over {budget.n_heads} heads)") \
            from None
    return sum(parameter.numel() for parameter in model.parameters())


def _reads_width(module, task, budget: Budget) -> bool:
    """Whether the scheme's parameter count depends on the feed-forward width (a scheme without one: not)."""
    return _count(module, task, budget, 1) != _count(module, task, budget, 2)


def _matched_width(module, task, budget: Budget, target: int) -> int:
    """The feed-forward width whose parameter count is nearest ``target`` (counts are affine in it); a scheme
    without a feed-forward is run as it is where its count is within 3 % of ``target``, and refused otherwise."""
    low, high = _count(module, task, budget, 1), _count(module, task, budget, 2)
    if high == low:
        if abs(low - target) > 0.03 * target:
            raise SplitformerError(f"{module.SCHEME}: {low} parameters whatever the feed-forward width (it has none), "
                                   f"against the {target} of the first scheme: not within 3 %, so the counts cannot "
                                   "be matched")
        return budget.d_ff
    width = round(1 + (target - low) / (high - low))
    if width < 1:
        raise SplitformerError(f"{module.SCHEME}: {low} parameters already at feed-forward width 1, more than the "
                               f"{target} of the first scheme; put the larger scheme first")
    return width


# --- training ---------------------------------------------------------------------------------

def _warm_up(steps: int) -> int:
    """Steps of the linear warm-up: ``_WARM_UP``, or a tenth of a shorter run (at least one)."""
    return min(_WARM_UP, max(1, steps // 10))


def _rate(steps: int, step: int) -> float:
    """The learning rate of ``step`` (0-based) over ``lr``: rising linearly to 1 at the warm-up's last step, then a
    cosine decay towards 0 at the run's end."""
    warm = _warm_up(steps)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step + 1 - warm) / (steps + 1 - warm)))


def _loss(logits, targets):
    import torch

    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)


def _evaluate(model, task, budget: Budget, seed: int) -> tuple[float, float]:
    """Validation loss and accuracy (on the scored targets) over fixed batches."""
    import torch

    losses, right, scored = [], 0, 0
    model.eval()
    with torch.no_grad():
        for batch in task.evaluation(budget, seed):
            inputs, targets = (torch.from_numpy(array) for array in batch)
            logits = model(inputs)
            losses.append(float(_loss(logits, targets)))
            kept = targets != -100
            right += int((logits.argmax(-1)[kept] == targets[kept]).sum())
            scored += int(kept.sum())
    model.train()
    return statistics.fmean(losses), right / scored


def _train(module, task, budget: Budget, d_ff: int, seed: int, progress) -> Run:
    import torch

    torch.manual_seed(seed)
    model = task.model(module, budget, d_ff)
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(_rate, budget.steps))
    rng, run, every = np.random.default_rng(seed), Run(), max(1, budget.steps // 10)
    for step in range(budget.steps):
        inputs, targets = (torch.from_numpy(array) for array in task.batch(rng, budget.batch))
        start = time.perf_counter()
        loss = _loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        run.step_time += time.perf_counter() - start
        run.train_loss.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == budget.steps:
            valid_loss, accuracy = _evaluate(model, task, budget, seed)
            run.valid_steps.append(step + 1)
            run.valid_loss.append(valid_loss)
            run.valid_accuracy = accuracy
            progress(step + 1, run.train_loss[-1])
    run.step_time /= budget.steps
    return run


# --- the study --------------------------------------------------------------------------------

def _spread(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for one seed: not measured, not zero; NaN where a seed's value is not
    finite: a diverged run, which ``statistics.stdev`` cannot take)."""
    if len(values) == 1:
        return values[0], None
    return statistics.fmean(values), statistics.stdev(values) if all(map(math.isfinite, values)) else math.nan


def _counted(count: int, noun: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _cell(spread: tuple[float, float | None], digits: int) -> str:
    """``mean ± std``, or the mean alone for one seed."""
    mean, std = spread
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


@dataclass
class Study:
    """The runs of every variant, with its parameter count and feed-forward width."""

    task: str
    budget: Budget
    tokens: int
    variants: dict[str, dict] = field(default_factory=dict)

    def rows(self) -> list[dict]:
        """One summary per variant: means and spreads over seeds of the final numbers."""
        window = max(1, self.budget.steps // 10)
        rows = []
        for name, variant in self.variants.items():
            runs = variant["runs"]
            row = {"scheme": name, "source": variant["source"], "plugins": variant.get("plugins", []),
                   "parameters": variant["parameters"],
                   "d_ff": variant["d_ff"],
                   "train_loss": _spread([statistics.fmean(run.train_loss[-window:]) for run in runs]),
                   "valid_loss": _spread([run.valid_loss[-1] for run in runs]),
                   "step_ms": _spread([1000 * run.step_time for run in runs])}
            if self.task != "chars":
                row["valid_accuracy"] = _spread([run.valid_accuracy for run in runs])
            rows.append(row)
        return rows

    def as_markdown(self) -> str:
        accuracy = self.task != "chars"
        budget = self.budget
        lines = [f"Task `{self.task}`, {_counted(budget.steps, 'step')} × batch {budget.batch} × "
                 f"{_counted(self.tokens, 'token')}, d_model {budget.d_model}, {_counted(budget.n_layers, 'layer')}, "
                 + (f"{budget.seeds} seeds (mean ± standard deviation over seeds; " if budget.seeds > 1 else
                    "1 seed (no spread measured; ")
                 + "train loss: mean of the last tenth of the steps; validation: at the last step); "
                 f"{_counted(budget.n_heads, 'head')}; AdamW (weight decay 0.01), its learning rate "
                 + (f"rising linearly to {budget.lr:g} over the first {_warm_up(budget.steps)} steps"
                    if _warm_up(budget.steps) > 1 else f"{budget.lr:g} at the first step")
                 + ", then a cosine decay towards 0",
                 "",
                 "| scheme | parameters | d_ff | train loss | validation loss |" + (" validation accuracy |" if accuracy else "")
                 + " ms/step |",
                 "|---|---:|---:|---:|---:|" + ("---:|" if accuracy else "") + "---:|"]
        for row in self.rows():
            cells = [row["scheme"], str(row["parameters"]), "—" if row["d_ff"] is None else str(row["d_ff"]),
                     _cell(row["train_loss"], 3), _cell(row["valid_loss"], 3)]
            if accuracy:
                cells.append(_cell(row["valid_accuracy"], 3))
            cells.append(_cell(row["step_ms"], 1))
            lines.append("| " + " | ".join(cells) + " |")
        if any(not math.isfinite(value) for row in self.rows() for key in ("train_loss", "valid_loss")
               for value in row[key] if value is not None):
            lines += ["", "nan or inf: a seed's loss was not finite (the run diverged); study.json holds null there."]
        files = [(name, variant["source"]) for name, variant in self.variants.items() if variant["source"]]
        if files:
            lines += ["", "Read from files: " + "; ".join(f"`{name}` from `{source}`" for name, source in files) + "."]
        plugins = [(name, variant["plugins"]) for name, variant in self.variants.items() if variant.get("plugins")]
        if plugins:
            lines += ["", "Operator kinds from plug-in files: " + "; ".join(
                f"`{name}` from " + ", ".join(f"`{file}`" for file in files) for name, files in plugins) + "."]
        return inert("\n".join(lines), "the study table")

    def as_json(self) -> dict:
        rows = [{key: (dict(zip(("mean", "std"), value)) if isinstance(value, tuple) else value)
                 for key, value in row.items()} for row in self.rows()]
        curves = {name: [{"train_loss": run.train_loss, "valid_steps": run.valid_steps, "valid_loss": run.valid_loss,
                          "step_ms": 1000 * run.step_time,
                          **({} if self.task == "chars" else {"valid_accuracy": run.valid_accuracy})}
                         for run in variant["runs"]] for name, variant in self.variants.items()}
        return json_numbers({"task": self.task, "budget": self.budget.__dict__, "rows": rows, "curves": curves})

    def plot(self, path: Path | None = None):
        """Training loss (mean over seeds, smoothed) and validation loss per variant: written to
        ``path``, or the figure when ``None`` (a notebook displays it as its PNG image)."""
        from .figures import InlineFigure

        figure = InlineFigure(figsize=(10, 4), dpi=110)
        axes = figure.subplots(1, 2)
        window = max(1, self.budget.steps // 50)
        for name, variant in self.variants.items():
            runs = variant["runs"]
            mean = np.mean([run.train_loss for run in runs], axis=0)
            smooth = np.convolve(mean, np.ones(window) / window, mode="valid")
            line, = axes[0].plot(np.arange(window, len(mean) + 1), smooth, label=f"{name} ({variant['parameters']})")
            valid = np.array([run.valid_loss for run in runs])
            axes[1].errorbar(runs[0].valid_steps, valid.mean(axis=0), yerr=valid.std(axis=0, ddof=1) if len(runs) > 1 else None, color=line.get_color(),
                             label=name, capsize=2)
        seeds = self.budget.seeds > 1
        for axis, title in zip(axes, ("train loss" + (" (mean over seeds)" if seeds else ""),
                                      "validation loss" + (" (± std over seeds)" if seeds else " (one seed)"))):
            axis.set_xlabel("step")
            axis.set_title(title)
            axis.grid(alpha=0.3)
        axes[0].legend()
        figure.suptitle(f"splitformer study: {self.task}")
        figure.tight_layout()
        if path is None:
            return figure
        path = Path(path)
        check_replaceable(path, hint="remove it or choose another file")
        write_files({path: figure.marked_png()}, root=path.parent)  # through a symbolic link, as derive writes
        return path

    def __repr__(self) -> str:
        budget = self.budget
        return (f"<Study {self.task}: {', '.join(self.variants)}; {budget.steps} steps × {budget.seeds} seeds>")

    def _repr_markdown_(self) -> str:
        return self.as_markdown()

    def write(self, out: str | Path = "study", force: bool = False) -> list[Path]:
        """Write ``FILES`` (table, numbers and curves, plot) into ``out``, all or nothing; returns their paths.

        Like ``splitformer derive``: nothing lands outside ``out`` (symbolic links resolved), and a file
        that splitformer did not write is refused unless ``force``.
        """
        if not isinstance(force, bool):
            raise SplitformerError(f"force: expected bool, got {type(force).__name__}")
        out = as_folder(out, "out")
        header = f"Generated by splitformer {__version__} from the study `{self.task}`; do not edit."
        table, numbers, plot = (out / name for name in FILES)
        files = {table: f"*{header}*\n\n{self.as_markdown()}\n",
                 numbers: json.dumps({JSON_GENERATOR: header, **self.as_json()}, indent=1, allow_nan=False) + "\n",
                 plot: self.plot().marked_png()}
        write_files(files, force=force, root=out)
        return list(files)


def _training_source() -> str:
    """The source of the code that builds and trains a variant (this module, ``nn``): an edit of it between two
    studies (an editable install keeps its version) trains again."""
    from . import nn

    return inspect.getsource(sys.modules[__name__]) + inspect.getsource(nn)


def _run(runs: RunStore | None, name: str, seed: int, key: str | None, steps: int, label: str, train) -> Run:
    """One run: taken up from ``runs`` where it holds it under ``key``, else ``train(progress)`` (and kept there)."""
    kept = None if runs is None else runs.taken_up(name, seed, key, steps)
    if kept is not None:
        print(f"{label}: taken up from {runs.path(name, seed)}", file=sys.stderr, flush=True)
        return kept
    run = train(_reporter(label, steps))
    if runs is not None:
        runs.keep(name, seed, key, run)
    return run


def _reporter(label: str, steps: int):
    terminal = sys.stderr.isatty()
    start = time.monotonic()

    def progress(step: int, loss: float) -> None:
        if terminal or step == steps:
            end = "\n" if step == steps else "\r"
            print(f"{label}: step {step}/{steps}, loss {loss:.3f}, {time.monotonic() - start:.0f} s", end=end,
                  file=sys.stderr, flush=True)

    return progress


def _plugin_files(scheme) -> list[str]:
    """The plug-in files that define the operator kinds ``scheme`` uses (none for an emitted module passed in)."""
    if isinstance(scheme, types.ModuleType):
        return []
    from .api import as_scheme

    kinds = set(as_scheme(scheme).operators.values())
    return sorted({file for file in (plugin_file(OPERATOR_KINDS[kind]) for kind in kinds) if file is not None})


def _file_of(scheme) -> str | None:
    """The scheme file a study's variant was read from, as given; ``None`` for a built-in or a ``Scheme``."""
    if isinstance(scheme, os.PathLike) or (isinstance(scheme, str) and scheme not in builtin_names()):
        return os.fspath(scheme)
    return None


def study(schemes: list, task: str = "chars", budget: Budget = Budget(),
          runs: str | os.PathLike | RunStore | None = None) -> Study:
    """Train every scheme (a built-in name, scheme file or ``Scheme``) at the parameter count of the first.

    ``runs``: a folder where each run is kept as it ends and taken up by the same study later (``study_runs``): an
    interrupted study, called again, trains only what it had not finished; a study with a variant more trains only
    that one (where the first variant, whose count the others match, is the same)."""
    import torch

    if task not in TASKS:
        raise SplitformerError(f"unknown task {task!r}; choose {' or '.join(TASKS)}")
    if isinstance(schemes, (str, os.PathLike, Scheme)):  # one scheme, not a sequence of its letters
        raise SplitformerError(f"schemes: expected a list of schemes, got one {type(schemes).__name__}: "
                               f"study([{schemes!r}], ...)")
    if not schemes:
        raise SplitformerError("give at least one scheme")
    if task in SEQUENCES:  # ``tokens`` is chars' sequence length; the others have their own, recorded as trained
        budget = replace(budget, tokens=SEQUENCES[task])
    budget.check()
    data = _task(task, budget)
    modules = [data.module(scheme) for scheme in schemes]
    names = [module.SCHEME for module in modules]
    check_distinct(names, "study")
    target = _count(modules[0], data, budget, budget.d_ff)  # counted on the meta device: nothing allocated yet
    widths = [budget.d_ff] + [_matched_width(module, data, budget, target) for module in modules[1:]]
    counts = [_count(module, data, budget, width) for module, width in zip(modules, widths)]
    for name, count in zip(names, counts):
        _check_parameters(name, count)
    if runs is not None and not isinstance(runs, RunStore):
        runs = RunStore(as_folder(runs, "runs"), task)
    if runs is not None:
        runs.check(names, budget.seeds)
    result = Study(task, budget, data.sequence)
    total = len(modules) * budget.seeds
    training = _training_source() if runs is not None else ""
    threads = torch.get_num_threads()
    torch.set_num_threads(budget.threads)
    try:
        for index, (name, scheme, module, width, count) in enumerate(zip(names, schemes, modules, widths, counts)):
            trained = []
            for seed in range(budget.seeds):
                label = f"[{index * budget.seeds + seed + 1}/{total}] {name} seed {seed}"
                key = None if runs is None else run_key(module, task, budget, width, seed, training)
                trained.append(_run(runs, name, seed, key, budget.steps, label,
                                    functools.partial(_train, module, data, budget, width, seed)))
            result.variants[name] = {"parameters": count, "runs": trained,
                                     "d_ff": width if _reads_width(module, data, budget) else None,
                                     "source": _file_of(scheme), "plugins": _plugin_files(scheme)}
    finally:
        torch.set_num_threads(threads)
    return result

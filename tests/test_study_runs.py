"""A study's runs kept as they end (``study(runs=…)``, ``splitformer study``'s ``OUT/runs/``) and taken up again."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

import torch  # noqa: F401 - test dependencies: a broken install fails, never skips

from splitformer.codegen import study as study_module
from splitformer.codegen.cli import main
from splitformer.codegen.study import Budget, study
from splitformer.symbolic.errors import SplitformerError

TINY = Budget(steps=3, seeds=2, d_model=8, n_heads=2, n_layers=1, d_ff=16, batch=2, tokens=8, eval_batches=1)


def _numbers(result):
    """Every run's curves and final numbers (the step times aside: a clock's)."""
    return {name: [{key: value for key, value in run.items() if key != "step_ms"} for run in runs]
            for name, runs in result.as_json()["curves"].items()}


@pytest.fixture
def trainings(monkeypatch):
    """The (scheme width, seed) of each run trained, not taken up; ``interrupt_at``: the training that is
    interrupted (Ctrl-C), counted from 1."""
    trained, real = [], study_module._train

    def train(module, task, budget, d_ff, seed, progress):
        trained.append((d_ff, seed))
        if len(trained) == train.interrupt_at:
            raise KeyboardInterrupt
        return real(module, task, budget, d_ff, seed, progress)

    train.interrupt_at = 0
    monkeypatch.setattr(study_module, "_train", train)
    return train, trained


def test_an_interrupted_study_called_again_trains_only_what_it_had_not_finished(tmp_path, trainings):
    """Ctrl-C in the third of four runs: the two finished are kept; the same study again trains the other two and
    gives every number an uninterrupted study gives (control: a study without ``runs`` in the same process)."""
    train, trained = trainings
    train.interrupt_at = 3
    with pytest.raises(KeyboardInterrupt):
        study(["pre-ln", "post-ln"], "chars", TINY, runs=tmp_path / "runs")
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["pre-ln-seed0.json", "pre-ln-seed1.json"]
    train.interrupt_at, trained[:] = 0, []
    resumed = study(["pre-ln", "post-ln"], "chars", TINY, runs=tmp_path / "runs")
    assert [seed for _, seed in trained] == [0, 1]  # post-ln's two seeds alone
    assert _numbers(resumed) == _numbers(study(["pre-ln", "post-ln"], "chars", TINY))


def test_a_run_is_taken_up_only_under_the_same_key(tmp_path, trainings):
    """Another budget, another first variant (the width the others match) or another scheme trains again; the same
    study trains nothing."""
    _, trained = trainings
    runs = tmp_path / "runs"
    budget = replace(TINY, seeds=1)
    study(["pre-ln", "post-ln"], "chars", budget, runs=runs)
    assert len(trained) == 2
    study(["pre-ln", "post-ln"], "chars", budget, runs=runs)
    assert len(trained) == 2
    study(["pre-ln", "post-ln"], "chars", replace(budget, lr=1e-3), runs=runs)
    assert len(trained) == 4
    study(["macaron", "pre-ln"], "chars", replace(budget, lr=1e-3), runs=runs)  # pre-ln matched to macaron's count
    assert len(trained) == 6


@pytest.mark.parametrize("edit", [
    lambda data: json.dumps(data)[:-20],  # cut short: its header whole
    lambda data: json.dumps({**data, "key": "0" * 64}),
    lambda data: json.dumps({**data, "run": {**data["run"], "train_loss": data["run"]["train_loss"][:-1]}}),
    lambda data: json.dumps({**data, "run": {**data["run"], "valid_loss": "high"}}),
    lambda data: json.dumps({**data, "run": {**data["run"], "valid_steps": [3, 3]}}),
    lambda data: json.dumps({**data, "run": {**data["run"], "step_time": True}}),
    lambda data: json.dumps({**data, "run": [data["run"]]}),
])
def test_a_kept_file_that_is_not_a_whole_run_of_the_key_is_trained_again(tmp_path, trainings, edit):
    """A file of splitformer's (its header) holding no whole run of the key: the run is trained and kept again."""
    _, trained = trainings
    runs, budget = tmp_path / "runs", replace(TINY, seeds=1)
    first = study(["pre-ln"], "chars", budget, runs=runs)
    path = runs / "pre-ln-seed0.json"
    path.write_text(edit(json.loads(path.read_text())))
    again = study(["pre-ln"], "chars", budget, runs=runs)
    assert len(trained) == 2 and _numbers(again) == _numbers(first)
    assert json.loads(path.read_text())["run"]["train_loss"] == first.variants["pre-ln"]["runs"][0].train_loss


def test_a_diverged_runs_losses_are_kept_as_null_and_taken_up_as_nan(tmp_path, trainings):
    _, trained = trainings
    runs, budget = tmp_path / "runs", replace(TINY, seeds=1)
    study(["pre-ln"], "chars", budget, runs=runs)
    path = runs / "pre-ln-seed0.json"
    data = json.loads(path.read_text())
    data["run"]["train_loss"][-1] = data["run"]["valid_loss"][-1] = None
    path.write_text(json.dumps(data))
    run = study(["pre-ln"], "chars", budget, runs=runs).variants["pre-ln"]["runs"][0]
    assert len(trained) == 1 and math.isnan(run.train_loss[-1]) and math.isnan(run.valid_loss[-1])


def test_a_file_splitformer_did_not_write_is_refused_before_training_unless_forced(tmp_path, capsys, monkeypatch):
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "pre-ln-seed0.json").write_text('{"mine": 1}\n')
    command = ["study", "pre-ln", "--steps", "1", "--seeds", "1", "--d-model", "8", "--layers", "1", "--batch", "2",
               "--tokens", "8", "--out", str(tmp_path / "out")]
    with monkeypatch.context() as patched:
        patched.setattr(study_module, "_train", lambda *_: pytest.fail("trained before the runs were checked"))
        assert main(command) == 2
    assert "pre-ln-seed0.json exists and was not written by splitformer" in capsys.readouterr().err
    assert main([*command, "--force"]) == 0
    assert json.loads((tmp_path / "out" / "runs" / "pre-ln-seed0.json").read_text())["scheme"] == "pre-ln"
    assert main(command) == 0 and "[1/1] pre-ln seed 0: taken up from" in capsys.readouterr().err


def test_runs_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SplitformerError, match="runs: .* exists and is not a folder"):
        study(["pre-ln"], "chars", replace(TINY, seeds=1), runs=tmp_path / "file")


def test_torchs_default_dtype_and_the_training_code_are_in_the_key(tmp_path, trainings, monkeypatch):
    """A reviewer's finding: a study after ``torch.set_default_dtype(torch.float64)`` took up the float32 run, and one
    after an edit of the training code (an editable install keeps its version) the old run."""
    _, trained = trainings
    runs, budget = tmp_path / "runs", replace(TINY, seeds=1)
    study(["pre-ln"], "chars", budget, runs=runs)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        study(["pre-ln"], "chars", budget, runs=runs)
    finally:
        torch.set_default_dtype(previous)
    assert len(trained) == 2
    monkeypatch.setattr(study_module, "_training_source", lambda: "edited")
    study(["pre-ln"], "chars", budget, runs=runs)
    assert len(trained) == 3


def test_more_seeds_take_up_the_runs_of_the_seeds_kept(tmp_path, trainings):
    """A tester's finding (s45): ``--seeds 3`` after ``--seeds 2`` trained all six runs again, though each run is one
    seed's and came out the same; the number of seeds is not in a run's key (control: another step count is)."""
    _, trained = trainings
    runs = tmp_path / "runs"
    study(["pre-ln"], "chars", TINY, runs=runs)
    assert [seed for _, seed in trained] == [0, 1]
    study(["pre-ln"], "chars", replace(TINY, seeds=3), runs=runs)
    assert [seed for _, seed in trained] == [0, 1, 2]
    study(["pre-ln"], "chars", replace(TINY, seeds=3, steps=4), runs=runs)
    assert [seed for _, seed in trained] == [0, 1, 2, 0, 1, 2]


def test_a_second_study_into_a_folder_in_use_is_refused(tmp_path, capsys, monkeypatch):
    """A tester's finding (s45): two studies writing into one ``--out`` at once both exited 0, each file the last
    writer's (the table of one, the runs of the other). The second is refused while the first holds the folder (here:
    this process holds its lock as a running study would); control: the folder released, the study runs."""
    import fcntl
    import os

    monkeypatch.setattr(study_module, "_train", lambda *_: pytest.fail("trained in a folder another study holds"))
    out = tmp_path / "out"
    out.mkdir()
    arguments = ["study", "pre-ln", "--steps", "1", "--seeds", "1", "--d-model", "8", "--layers", "1", "--batch", "2",
                 "--tokens", "8", "--out", str(out)]
    held = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(arguments) == 2
    finally:
        os.close(held)
    err = capsys.readouterr().err
    assert "--out: another splitformer process is writing in" in err and err.count("\n") == 1
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    assert main(arguments) == 0
    assert (out / "study.json").is_file()


def test_budgets_take_numpys_integers_and_a_single_scheme_is_refused_by_name():
    """A tester's findings (s45): ``Budget(seeds=np.int64(1))`` was refused as not a positive integer, and
    ``study("pre-ln")`` read the name letter by letter ("unknown scheme 'p'")."""
    import numpy as np

    budget = Budget(seeds=np.int64(2), steps=np.int32(5))
    assert budget.seeds == 2 and type(budget.seeds) is int and type(budget.steps) is int
    budget.check()
    with pytest.raises(SplitformerError, match=r"schemes: expected a list of schemes, got one str: "
                                               r"study\(\['pre-ln'\], \.\.\.\)"):
        study("pre-ln", "chars", TINY)


def test_a_runs_folder_no_file_can_be_written_in_is_refused_before_training(tmp_path, trainings, monkeypatch):
    """A tester's finding (s45): with ``OUT`` writable and ``OUT/runs`` not (``chattr +i``: root ignores permission
    bits), the first run trained in full, then the study failed keeping it. The folder is probed before any training
    (here the probe's temporary file is refused there, as the immutable folder refuses it)."""
    import errno
    import tempfile

    _, trained = trainings
    runs = tmp_path / "runs"
    runs.mkdir()
    real = tempfile.TemporaryFile

    def refused(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == runs:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with pytest.raises(SplitformerError, match=r"^runs: cannot write in .*runs: Operation not permitted$"):
        study(["pre-ln"], "chars", TINY, runs=runs)
    assert trained == []

"""``splitformer study``: matched parameter counts, reproducible runs, the files, bad input."""

import json

import numpy as np
import pytest

import torch  # noqa: F401 - test dependencies: a broken install fails, never skips
import matplotlib  # noqa: F401

from splitformer.codegen.cli import main  # noqa: E402
from splitformer.codegen.study import Budget, _Chars, _Recall, _evaluate, study  # noqa: E402

TINY = Budget(steps=3, seeds=2, d_model=8, n_heads=2, n_layers=1, d_ff=16, batch=2, tokens=8, eval_batches=1)


def test_mqar_answers_are_the_values_of_the_queried_keys():
    inputs, targets = _Recall().batch(np.random.default_rng(0), 3)
    for row, target in zip(inputs, targets):
        pairs = dict(zip(row[0:16:2], row[1:16:2]))
        scored = np.flatnonzero(target != -100)
        assert len(scored) == 8 and all(target[i] == pairs[row[i]] == row[i + 1] for i in scored)


def _oracle(task, shift: int):
    """A model whose logits single out the token ``shift`` places ahead (1: MQAR's answer)."""
    class Oracle(torch.nn.Module):
        def forward(self, inputs):
            return 50.0 * torch.nn.functional.one_hot(torch.roll(inputs, -shift, dims=1), task.vocab).double()

    return Oracle()


def test_accuracy_is_the_share_of_scored_answers_predicted():
    task, budget = _Recall(), Budget(batch=3, eval_batches=2)
    loss, accuracy = _evaluate(_oracle(task, 1), task, budget, seed=0)
    assert accuracy == 1.0 and loss < 1e-12
    assert _evaluate(_oracle(task, 0), task, budget, seed=0)[1] == 0.0  # names the key: never the value


def test_the_plot_has_the_two_documented_panels(tmp_path, monkeypatch):
    import matplotlib.figure

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda figure, *_, **__: saved.append(figure))
    study(["pre-ln"], "chars", TINY).plot(tmp_path / "loss.png")
    [figure] = saved
    assert [axis.get_title() for axis in figure.axes] == ["train loss (mean over seeds)",
                                                         "validation loss (± std over seeds)"]


def test_chars_reads_the_standard_library():
    task = _Chars(8)
    inputs, targets = task.batch(np.random.default_rng(0), 2)
    assert b"import" in task.train.astype(np.uint8).tobytes() and inputs.max() < 128
    assert np.array_equal(inputs[:, 1:], targets[:, :-1])


def test_same_seed_same_numbers_and_matched_counts():
    first, again = (study(["pre-ln", "macaron"], "chars", TINY) for _ in range(2))
    def numbers(result):  # each run's time aside
        return json.dumps({name: [{key: value for key, value in run.items() if key != "step_ms"} for run in runs]
                           for name, runs in result.as_json()["curves"].items()})

    assert numbers(first) == numbers(again)
    runs = first.variants["pre-ln"]["runs"]
    assert runs[0].train_loss != runs[1].train_loss  # seeds differ
    counts = [variant["parameters"] for variant in first.variants.values()]
    assert abs(counts[1] - counts[0]) / counts[0] < 0.03
    assert first.variants["macaron"]["d_ff"] < first.variants["pre-ln"]["d_ff"]  # two feed-forwards


def test_the_command_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    status = main(["study", "pre-ln", "llama", "--task", "mqar", "--steps", "2", "--seeds", "1", "--d-model", "8",
                   "--layers", "1", "--batch", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 0 and "| llama |" in captured.out and "[2/2] llama seed 0: step 2/2" in captured.err
    rows = json.loads((out / "study.json").read_text())["rows"]
    assert [row["scheme"] for row in rows] == ["pre-ln", "llama"] and 0 <= rows[0]["valid_accuracy"]["mean"] <= 1
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG" and "validation accuracy" in (out / "study.md").read_text()


def test_digits_trains_a_classifier_over_the_stack():
    import sklearn  # noqa: F401 - in the test extra: fails, never skips
    result = study(["post-ln"], "digits", Budget(steps=2, seeds=1, d_model=8, n_heads=2, n_layers=1, d_ff=8))
    row = result.rows()[0]
    assert result.tokens == 16 and 0 <= row["valid_accuracy"][0] <= 1 and row["parameters"] > 0
    # one seed: no spread measured, said so (it printed "1 seeds" and "± 0.000", which reads as no variance)
    assert row["valid_loss"][1] is None and result.as_json()["rows"][0]["valid_loss"]["std"] is None
    text = result.as_markdown()
    assert "1 seed (no spread measured;" in text and "±" not in text.split("\n", 1)[1]


def test_digits_without_scikit_learn_is_one_clear_error(monkeypatch):
    import sys

    from splitformer import SplitformerError

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(SplitformerError, match="needs scikit-learn"):
        study(["post-ln"], "digits", TINY)


@pytest.mark.parametrize("arguments, message", [
    (["nope"], "unknown scheme 'nope'"),
    (["vit"], "not a block scheme"),
    (["decoder"], "attends to a memory"),
    (["pre-ln", "--steps", "0"], "steps must be a positive integer"),
    (["pre-ln", "--lr", "nan"], "lr must be a real number in (0, 1], got nan"),
    # a tester's finding: --tokens was ignored by mqar (and recorded), yet could refuse the run by its size
    (["pre-ln", "--task", "mqar", "--tokens", "60000"], "--tokens sets the sequence length of --task chars; mqar has 32 tokens"),
    # a tester's finding: digits trained gpt2 attending both ways, which nn.Classifier refuses
    (["gpt2", "--task", "digits"], "gpt2: the scheme declares causal = true, but a Classifier (study --task digits) "
                                   "attends both ways"),
    # a tester's finding: the limit was said to be 1 GiB, yet let 1.08 billion parameters through
    (["pre-ln", "--d-model", "16384", "--layers", "1", "--batch", "1", "--tokens", "1"],
     "pre-ln: 1,080,230,016 parameters, more than 268,435,456 (1 GiB of float32 weights"),
    (["pre-ln", "pre-ln"], "given twice"),
    # sizes the scheme's Stack refuses: heads of 3 features hold no rotary pairs
    (["llama", "--d-model", "12"], "llama: rotary position embedding needs an even head width, got d_head = 3 "
                                   "(d-model 12 over 4 heads)"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, arguments, message):
    assert main(["study", *arguments, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


MQAR_TINY = ["pre-ln", "--task", "mqar", "--steps", "1", "--seeds", "1", "--d-model", "8", "--layers", "1",
             "--batch", "2"]


@pytest.fixture
def no_training(monkeypatch):
    """Training fails the test: a refused output folder is refused before any of it."""
    def train(*_):
        raise AssertionError("trained before the output folder was checked")

    monkeypatch.setattr("splitformer.codegen.study._train", train)


def test_a_symbolic_link_out_of_the_folder_is_refused_before_training(tmp_path, capsys, no_training):
    victim, out = tmp_path / "victim.txt", tmp_path / "out"
    victim.write_text("precious\n")
    out.mkdir()
    (out / "study.md").symlink_to("../victim.txt")
    assert main(["study", *MQAR_TINY, "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert "outside the output folder" in err and err.count("\n") == 1
    assert victim.read_text() == "precious\n" and sorted(path.name for path in out.iterdir()) == ["study.md"]


def test_a_users_own_study_json_is_kept_unless_forced(tmp_path, capsys, no_training):
    mine = tmp_path / "study.json"
    mine.write_text('{"my": "own notes"}\n')
    assert main(["study", *MQAR_TINY, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "study.json exists and was not written by splitformer; pass --force" in err and err.count("\n") == 1
    assert mine.read_text() == '{"my": "own notes"}\n' and sorted(path.name for path in tmp_path.iterdir()) == ["study.json"]


def test_a_second_study_replaces_what_the_first_wrote_and_force_replaces_a_users_file(tmp_path, capsys):
    from splitformer import SplitformerError

    result = study(["pre-ln"], "mqar", TINY)
    paths = result.write(tmp_path)
    first = [path.read_bytes() for path in paths]
    (tmp_path / "study.md").write_text("my own table\n")
    with pytest.raises(SplitformerError, match="study.md exists and was not written by splitformer"):
        result.write(tmp_path)
    assert (tmp_path / "study.md").read_text() == "my own table\n"
    assert result.write(tmp_path, force=True) == paths and [path.read_bytes() for path in paths] == first
    assert main(["study", *MQAR_TINY, "--out", str(tmp_path)]) == 0  # the files splitformer wrote: replaced
    capsys.readouterr()
    assert json.loads((tmp_path / "study.json").read_text())["budget"]["steps"] == 1
    assert [path.read_bytes() != data for path, data in zip(paths, first)] == [True, True, True]


ATTENTION_ONLY = """\
name = "{name}"
summary = "pre-norm attention alone, no feed-forward"
[operators]
norm = "layer-norm"
attn = "attention"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm"
"""


def test_a_scheme_without_a_feed_forward_is_matched_or_refused(tmp_path, capsys):
    """Review s32: ``study pre-ln attn-only.toml`` trained 42 % fewer parameters than pre-ln without a word, its table
    showing a d_ff it does not have. Now refused (no width to grow), and shown as "—" where run; control: two such
    schemes, whose counts match, run."""
    for name in ("attn-only", "attn-again"):
        (tmp_path / f"{name}.toml").write_text(ATTENTION_ONLY.format(name=name), encoding="utf-8")
    assert main(["study", "pre-ln", str(tmp_path / "attn-only.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "attn-only: " in err and "whatever the feed-forward width (it has none)" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    result = study([str(tmp_path / "attn-only.toml"), str(tmp_path / "attn-again.toml")], "chars", TINY)
    rows = result.rows()
    assert [row["d_ff"] for row in rows] == [None, None] and rows[0]["parameters"] == rows[1]["parameters"]
    assert all(line.split(" | ")[2] == "—" for line in result.as_markdown().splitlines() if "| attn-" in line)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, 0.0, "fast", True])
def test_a_learning_rate_that_cannot_train_is_refused_by_name(lr):
    """A tester's finding: ``Budget.check`` checked every size but not ``lr``: NaN and −1 reached torch's own errors,
    ``inf`` trained to NaN and wrote a ``nan | nan`` row."""
    from dataclasses import replace

    from splitformer import SplitformerError

    with pytest.raises(SplitformerError, match=r"^lr must be a real number in \(0, 1\], got"):
        replace(TINY, lr=lr).check()
    replace(TINY, lr=1e-3).check()  # the control


def test_the_learning_rate_warms_up_to_lr_then_decays():
    """A tester's finding: the warm-up (20 steps) was multiplied by a cosine over the whole run, so a 10-step run
    peaked at 0.16 lr. Now a warm-up of min(20, steps/10) steps reaches lr, then a cosine decays towards 0."""
    from splitformer.codegen.study import _rate

    for steps, warm in ((10, 1), (40, 4), (300, 20), (1, 1)):
        rates = [_rate(steps, step) for step in range(steps)]
        assert max(rates) == rates[warm - 1] == 1.0 and rates[:warm] == [(s + 1) / warm for s in range(warm)]
        assert all(later < earlier for earlier, later in zip(rates[warm - 1:], rates[warm:])) and rates[-1] >= 0


def test_the_command_takes_the_learning_rate_and_tells_files_on_stderr(tmp_path, capsys):
    """``--lr`` reaches the optimizer (there was no option); "wrote …" goes to stderr as compare's does, so that
    stdout holds the table alone; study.json records per seed its accuracy and step time, and mqar's sequence."""
    out = tmp_path / "out"
    assert main(["study", *MQAR_TINY, "--lr", "0.0125", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "learning rate 0.0125 at the first step" in captured.out and "wrote" not in captured.out
    assert captured.err.endswith(f"wrote {out / 'study.md'}, {out / 'study.json'}, {out / 'loss.png'}\n")
    document = json.loads((out / "study.json").read_text())
    assert document["budget"]["lr"] == 0.0125 and document["budget"]["tokens"] == 32
    [run] = document["curves"]["pre-ln"]
    assert 0 <= run["valid_accuracy"] <= 1 and run["step_ms"] > 0


def test_a_learning_rate_of_another_real_type_is_kept_as_a_float():
    """A reviewer's finding: ``Fraction(1, 1000)`` and ``np.float32(1e-3)`` passed the check, then study.md's
    ``{lr:g}`` and study.json failed after training."""
    from fractions import Fraction

    for lr in (Fraction(1, 1000), np.float32(1e-3)):
        budget = Budget(lr=lr)
        budget.check()
        assert type(budget.lr) is float and json.dumps(budget.__dict__)


def test_the_table_says_how_it_trained_and_which_file_each_row_read(tmp_path):
    """A tester's finding: study.md named neither the optimizer nor its learning rate, nor the file of a row."""
    from conftest import ROOT

    result = study(["pre-ln", str(ROOT / "tests" / "schemes" / "strang.toml")], "chars",
                   Budget(steps=2, seeds=1, d_model=8, n_heads=2, n_layers=1, d_ff=16, batch=2, tokens=8, eval_batches=1,
                          lr=2e-3))
    text = result.as_markdown()
    assert "2 heads; AdamW (weight decay 0.01), its learning rate 0.002 at the first step, then a cosine decay " \
        "towards 0" in text  # was "20 warm-up steps, then a cosine decay" whatever the steps
    assert "Task `chars`, 2 steps × batch 2 × 8 tokens, d_model 8, 1 layer, 1 seed" in text  # not "1 layers"
    assert f"from `{ROOT / 'tests' / 'schemes' / 'strang.toml'}`" in text and "`pre-ln` from" not in text
    assert [row["source"] for row in result.as_json()["rows"]][0] is None


def test_a_write_protected_table_is_refused_before_any_training(tmp_path, monkeypatch, capsys):
    """A tester's finding: a write-protected study.md (chmod a-w: kept on purpose) was refused only after every run
    had trained; a foreign file already was before."""
    import splitformer.codegen.study as study_module

    out = tmp_path / "out"
    out.mkdir()
    (out / "study.md").write_text("*Generated by splitformer 0 from the study `chars`; do not edit.*\n")
    (out / "study.md").chmod(0o444)
    monkeypatch.setattr(study_module, "_train", lambda *arguments: pytest.fail("trained before refusing"))
    assert main(["study", "pre-ln", "--steps", "2", "--seeds", "1", "--out", str(out)]) == 2
    assert "study.md is write-protected" in capsys.readouterr().err


def test_a_diverged_seed_is_written_as_nan_in_the_table_and_null_in_the_json(tmp_path, capsys):
    """Attacker s39 M1: a loss that is not finite in one of two seeds made statistics.stdev raise after all the training
    (a traceback, nothing written); with one seed, study.json held bare NaN, which strict JSON parsers refuse."""
    blow = tmp_path / "blow.toml"
    blow.write_text('name = "blow"\nsummary = "no norms, huge steps"\n[operators]\nattn = "attention"\n'
                    'ffn = "feed-forward"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\nfraction = 1000000000\n'
                    '[[steps]]\noperator = "ffn"\nsolver = "explicit"\nfraction = 1000000000\n')
    out = tmp_path / "out"
    assert main(["study", str(blow), "pre-ln", "--steps", "2", "--seeds", "2", "--d-model", "8", "--out", str(out)]) == 0
    table = (out / "study.md").read_text()
    assert "| blow |" in table and "nan ± nan" in table and "the run diverged" in table
    numbers = json.loads((out / "study.json").read_text(), parse_constant=lambda constant: pytest.fail(constant))
    blown, kept = numbers["rows"]
    assert blown["train_loss"] == {"mean": None, "std": None} and None in numbers["curves"]["blow"][0]["train_loss"]
    assert all(value is not None for value in kept["train_loss"].values())
    assert "diverged" not in (study(["pre-ln"], budget=TINY).as_markdown())  # the control: finite losses, no note


def test_the_table_names_the_plug_in_files_of_a_rows_kinds(tmp_path):
    """A tester's finding: study.md did not record the ``--load`` files a row's kinds came from. Now each row names
    the plug-in files defining its kinds (a running mean beside an attention, which decodes with its cache now);
    a built-in row names none."""
    import splitformer
    from conftest import ROOT

    plugin = ROOT / "tests" / "plugins" / "running_means.py"
    splitformer.load_plugin(plugin)
    scheme = tmp_path / "mean.toml"
    scheme.write_text('name = "attn-mean"\nsummary = "s"\ncausal = true\n[operators]\nattn = "attention"\n'
                      'pk = "inclusive-running-mean"\nffn = "feed-forward"\n[[steps]]\noperator = "attn"\n'
                      'solver = "explicit"\n[[steps]]\noperator = "pk"\nsolver = "explicit"\n'
                      '[[steps]]\noperator = "ffn"\nsolver = "explicit"\n')
    result = study(["pre-ln", str(scheme)], "chars",
                   Budget(steps=1, seeds=1, d_model=8, n_heads=2, n_layers=1, d_ff=16, batch=2, tokens=8, eval_batches=1))
    assert f"Operator kinds from plug-in files: `attn-mean` from `{plugin}`." in result.as_markdown()
    assert [row["plugins"] for row in result.as_json()["rows"]] == [[], [str(plugin)]]

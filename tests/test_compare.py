"""compare(): schemes side by side, and one convergence plot with all of them."""

import io
import re

import pytest
import torch

import splitformer
from splitformer import SplitformerError

from conftest import ROOT


@pytest.fixture(scope="module")
def table():
    return splitformer.compare(["post-ln", "parallel", "rk2"])


def test_rows_hold_orders_costs_and_parameters(table):
    rows = {row.scheme: row for row in table.rows}
    assert (rows["post-ln"].order, rows["post-ln"].splitting_order, rows["post-ln"].evaluations) == (1, 1, 4)
    assert rows["parallel"].evaluations == 3  # one LayerNorm shared by both fields
    assert (rows["rk2"].order, rows["rk2"].splitting_order, rows["rk2"].evaluations) == (2, None, 8)
    assert rows["rk2"].leading_error_text == "-(h*(attn + ffn))**3/6"  # one generator per operator instance


def test_parameter_count_matches_torch():
    layer = torch.nn.TransformerEncoderLayer(24, 4, 40)
    expected = sum(parameter.numel() for parameter in layer.parameters())
    text = splitformer.compare(["post-ln"], sizes={"d": 24, "d_ff": 40}).as_text()
    assert f" {expected} " in text


def test_grouped_heads_count_with_their_width_as_transformers_does():
    """Attack 24: llama's count kept ``d_kv`` (the keys' and values' width) as a symbol, and ``--sizes`` refused it."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=8,
                                      num_key_value_heads=2)  # d_kv = 2 heads of 8
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
    expected = sum(parameter.numel() for parameter in layer.parameters())
    assert f" {expected} " in splitformer.compare(["llama"], sizes={"d": 64, "d_ff": 96, "d_kv": 16}).as_text()
    assert f" {expected} " not in splitformer.compare(["llama"], sizes={"d": 64, "d_ff": 96, "d_kv": 32}).as_text()


def test_formats(table):
    text, markdown, latex = table.as_text(), table.as_markdown(), table.as_latex()
    assert text.splitlines()[0].split()[:4] == ["scheme", "order", "splitting", "evaluations"]
    assert "\\" not in text and "4*d**2 + 2*d*d_ff + 9*d + d_ff" in text
    assert markdown.count("\n") == 4 and "| `rk2` | 2 | — | 8 |" in markdown
    assert latex.startswith(r"\begin{tabular}") and r"\texttt{rk2} & 2 & -- & 8" in latex
    assert table._repr_markdown_() == markdown
    # generators upright (italic letters would typeset attn as a product a·t·t·n), the header as the text's
    assert r"(\mathrm{attn} + \mathrm{ffn})" in markdown.replace(r"\left(", "(").replace(r"\right)", ")")
    assert " attn" not in markdown.replace("`", " ") and "leading local error (own solvers) |" in markdown
    assert r"\mathrm{attn}" in latex and r"leading local error (own solvers) \\" in latex


def test_a_generator_is_one_upright_group():
    """Keys, colour suffixes (``&combine``, ``~shift``, ``>then``) and differentials: one ``\\mathrm`` group, every
    character LaTeX reads escaped (``&`` would end a table cell, ``~`` typeset as a space, ``a_`` print as ``a``)."""
    from splitformer.codegen.verification.statements.order import _roman

    assert _roman("ffn_pre") == r"\mathrm{ffn\_pre}" and _roman("a_") != _roman("a")
    assert _roman("ffn&g1") == r"\mathrm{ffn\&g1}" and _roman("attn~sh") == r"\mathrm{attn\sim sh}"
    assert _roman("ffn''(ffn, g)") == r"\mathrm{ffn''(ffn, g)}"
    row = splitformer.compare([ROOT / "tests" / "schemes" / "gated-shifted.toml"]).as_latex().splitlines()[3]
    assert len(re.findall(r"(?<!\\)&", row)) == 5 and r"\mathrm{ffn\&g1}" in row  # six cells: no '&' of a name
    assert r"\mathrm{attn\sim sh}^{2}" in row  # the power binds to the whole name


def test_one_plot_with_every_scheme(table, tmp_path):
    path = table.plot(tmp_path / "all.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert list(table.studies) == ["post-ln", "parallel", "rk2"]
    figure = table.plot()
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert [label.split()[0] for label in labels] == ["post-ln", "parallel", "rk2"]


def test_the_plot_shows_itself_in_a_notebook(table):
    """IPython displays an object's ``_repr_png_``: the figure, not ``<Figure size 560x420 with 1 Axes>``."""
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    figure = table.plot()
    png = figure._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(io.BytesIO(png)).shape[:2] == (420, 560)  # 5.6 x 4.2 inches at 100 dpi
    # drawn outside pyplot: no window manager, no interactive canvas (Agg renders the PNG)
    assert figure.canvas.manager is None and type(figure.canvas) is FigureCanvasBase
    assert not hasattr(Figure(), "_repr_png_")  # negative control: a plain Figure shows as text


def test_compare_needs_a_scheme():
    with pytest.raises(SplitformerError, match="at least one scheme"):
        splitformer.compare([])


def test_sizes_that_leave_a_count_half_symbolic_are_refused_by_name(tmp_path):
    """A per-head control counts ``n_heads``: with ``d`` and ``d_ff`` alone the count read "n_heads + 2224" beside
    numbers (a researcher's report). Refused, naming the size to give; control: given, it is a number."""
    step = ('name = "headed"\nsummary = "pre-LN with a per-head learned step"\n[operators]\nnorm1 = "layer-norm"\n'
            'attn = { kind = "scored-attention", alibi = true }\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
            'on = "norm1"\n')
    (tmp_path / "headed.toml").write_text(step)
    with pytest.raises(SplitformerError, match="also depend on n_heads: give it too"):
        splitformer.compare([str(tmp_path / "headed.toml")], sizes={"d": 16, "d_ff": 32})
    text = splitformer.compare([str(tmp_path / "headed.toml")], sizes={"d": 16, "d_ff": 32, "n_heads": 2}).as_text()
    assert "n_heads" not in text


def test_schemes_across_layers_are_compared_by_their_stack():
    """A tester's finding: ``compare`` gave a scheme combined across layers its one block's Euler order and error
    (Adams–Bashforth: order 1, −(h(attn + ffn))²/2), where the stack has order 2. Errors are scheme − exact, as a block's;
    on u' = u (G = u, G' = 1, G'' = 0) the leading term of Adams–Bashforth is −5/12 h³ (by hand: the two-step method's
    local error constant), of heavy-ball with β = 1/2 (u' = 2G) −3 h²."""
    schemes = ROOT / "tests" / "schemes"
    rows = {row.scheme: row for row in splitformer.compare([schemes / "adams-bashforth.toml", schemes / "heavy-ball.toml",
                                                            "post-ln"]).rows}
    by_name = {name: row for name, row in rows.items() if name != "post-ln"}
    adams, heavy = (next(row for name, row in by_name.items() if key in name) for key in ("adams", "heavy"))
    assert (adams.order, adams.splitting_order) == (2, None)
    assert adams.leading_error_text == "-5*G*h**3*(G*G'' + G'**2)/12"
    assert heavy.order == 1 and rows["post-ln"].order == 1  # the control: a block scheme keeps its own analysis
    assert heavy.leading_error_text == "-3*G*G'*h**2"


def test_a_plot_without_a_finite_error_is_refused_and_another_schemes_plot_names_it(tmp_path, capsys):
    """Attacker s39 L7: a scheme whose flow blows up before T = 1 got an empty plot, 'slope nan', and two NumPy
    RuntimeWarnings on stderr; `check` skips the same study saying why. Now: refused, nothing written, no warnings;
    beside a scheme with errors, it is named in the legend without points."""
    from splitformer.codegen.cli import main

    text = splitformer.load_scheme("post-ln").source.replace("fraction = 2", "fraction = 1000000000")
    assert "fraction = 1000000000" in text
    (tmp_path / "big.toml").write_text(text.replace('name = "post-ln"', 'name = "big"'))
    plot = tmp_path / "big.png"
    assert main(["compare", str(tmp_path / "big.toml"), "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plot: no error to plot for big:") and err.count("\n") == 1 and not plot.exists()
    assert main(["compare", str(tmp_path / "big.toml"), "post-ln", "--plot", str(plot)]) == 0
    assert "Warning" not in capsys.readouterr().err and plot.is_file()
    legend = [text.get_text() for text in splitformer.compare([str(tmp_path / "big.toml"), "post-ln"]).plot()
              .axes[0].get_legend().get_texts()]
    assert legend[0] == "big (not finite at T = 1: no error)" and legend[1] == "post-ln (slope 0.99)"

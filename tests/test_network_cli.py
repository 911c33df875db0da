"""The command line on built-in models: list, show, derive (all backends), bad input."""

from __future__ import annotations

import pytest

from splitformer.codegen.cli import main

NETWORKS = ("vit", "cvt", "resnet-block", "unet-level")


def test_list_marks_the_networks(capsys):
    assert main(["list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert all("(network)" in lines[name] for name in NETWORKS)


def test_derive_writes_both_backends_and_a_report_per_network(tmp_path, capsys):
    assert main(["derive", *NETWORKS, "--backend", "all", "--out", str(tmp_path)]) == 0
    for name in NETWORKS:
        module = name.replace("-", "_")
        for path in (f"numpy/{module}.py", f"torch/{module}.py", f"reports/{module}.md"):
            assert (tmp_path / path).is_file(), path
    assert "$$" in (tmp_path / "reports" / "vit.md").read_text()


@pytest.mark.parametrize("form", ["text", "latex", "markdown", "toml"])
def test_show_every_form(form, capsys):
    for name in NETWORKS:
        assert main(["show", name, "--format", form]) == 0
        assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("name", NETWORKS)
def test_show_latex_of_a_network_is_one_align_environment(name, capsys):
    """As --help says: one align* environment (section and operator titles as text rows), each row aligned once."""
    from latex_sanity import assert_renderable_align

    assert main(["show", name, "--format", "latex"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(r"\begin{align*}") and out.endswith(r"\end{align*}") and out.count(r"\begin{align*}") == 1
    assert_renderable_align(out)


def test_activation_is_refused_for_models_with_one_line(tmp_path, capsys):
    assert main(["derive", "vit", "--activation", "relu", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --activation applies to schemes") and error.count("\n") == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kernel, padding, holds", [(2, 1, False), (2, 0, False), (3, 1, True)])
def test_check_fails_a_grid_step_no_image_can_run(tmp_path, capsys, kernel, padding, holds):
    """Attack s33 L6: a field of one kernel-2, padding-1 convolution grows every grid by a node, so its F(u) never
    meets u and the module refuses every image; ``check`` skipped its adjoint test ("no grid size tried") and passed.
    It now tries sides 1 to 64 and fails where none runs; the kernel-3 control runs on 4 × 4 and passes. Unpadded, the
    kernel-2 field shrinks each grid by a node instead, and its 1 × 1 image is too small: ``check`` skipped it, saying
    every image was too small (a tester, s43); what is too small on the largest side alone makes a skip now."""
    import json

    path = tmp_path / "grows.toml"
    path.write_text(f'name = "grows"\nsummary = "one convolution"\n[operators]\nconv = {{ kind = "convolution", '
                    f'kernel = {kernel}, padding = {padding}, inputs = "c" }}\n[step]\nfield = ["conv"]\n')
    assert main(["check", str(path), "--only", "adjoint-test", "--format", "json"]) == (0 if holds else 1)
    checks = {check["id"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    if holds:
        assert checks["adjoint-test/grows/dot"]["holds"] and checks["adjoint-test/grows/taylor"]["holds"]
        return
    assert not checks["adjoint-test/grows"]["holds"]
    assert checks["adjoint-test/grows"]["detail"].startswith("no image runs the step: on 1 × 1 to 128 × 128 pixels")


def test_check_skips_a_grid_step_whose_images_up_to_128_are_too_small(tmp_path, capsys):
    """Review s33: seven stride-2 convolutions each way run on 255 × 255 only; every smaller image gives an empty
    grid. ``check`` said "no image runs the step" and failed it; it skips it, saying the images tried were too small
    (the kernel-2 field above, which its module refuses at every side, still fails)."""
    import json

    def halving(prefix):
        return "".join(f'{prefix}{i} = {{ kind = "convolution", kernel = 3, padding = 0, stride = 2'
                       + (', inputs = "c"' if i == 1 else "") + " }\n" for i in range(1, 8))

    def names(prefix):
        return "[" + ", ".join(f'"{prefix}{i}"' for i in range(1, 8)) + "]"

    path = tmp_path / "halves.toml"
    path.write_text('name = "halves"\nsummary = "seven strided convolutions each way"\n[operators]\n' + halving("a")
                    + halving("t") + f"[step]\nfield = {names('a')}\ntransfer = {names('t')}\n")
    assert main(["check", str(path), "--only", "adjoint-test", "--format", "json"]) == 2  # nothing checked: no success
    check = json.loads(capsys.readouterr().out)["checks"][0]
    assert check["method"] == "skipped" and check["detail"].startswith("an image of 128 × 128 pixels is still too small")


def test_check_runs_a_transfer_that_meets_the_field_at_stride_three(tmp_path, capsys):
    """A tester's finding (s43): a stride-2 field beside a shortcut of stride ``stride`` padded 2 meet at stride 3
    only; ``check`` tried strides 2 and 1 and failed the transfer as one that "can never run" (untested). It tries 3
    and 4 where neither runs, and tests the transfer there."""
    import json

    path = tmp_path / "third.toml"
    path.write_text('name = "third"\nsummary = "meets at stride 3"\n[operators]\nconv1 = { kind = "convolution", '
                    'kernel = 5, stride = 2, padding = 2, inputs = "c" }\nsc = { kind = "convolution", kernel = 3, '
                    'stride = "stride", padding = 2, inputs = "c" }\n[step]\nfield = ["conv1"]\ntransfer = ["sc"]\n')
    assert main(["check", str(path), "--only", "adjoint-test", "--format", "json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks and all(check["holds"] and check["method"] != "skipped" for check in checks)
    assert any("stride 3, with its transfer" in check["statement"] for check in checks)


def test_the_finite_difference_check_never_compares_zero_with_zero(tmp_path, capsys):
    """A tester's network file (s43): at the point its name seeds, ReLUs cut every path, so the derivative and its
    difference quotient were both 0; the check said "ok" (gap 0), its negative control failed (gap 0), and the same
    file under another name passed. Such a point is passed over for the next (``finite_difference_gaps``)."""
    import json

    path = tmp_path / "fz-bdtdh.toml"
    path.write_text('name = "fz-bdtdh"\nsummary = "fuzzed grid network"\n[operators]\n'
                    'relu1 = { kind = "relu-projection", inputs = "c" }\n'
                    'bn2 = { kind = "batch-norm", inputs = "c", outputs = "c" }\n'
                    'bn3 = { kind = "batch-norm", inputs = "c", outputs = "c" }\n'
                    'up4 = { kind = "transposed-convolution", kernel = 1, inputs = "c" }\n'
                    'relu5 = { kind = "relu-projection" }\n'
                    '[step]\nfield = ["relu1", "bn2", "bn3", "bn3", "up4"]\nprojection = "relu5"\n')
    assert main(["check", str(path), "--only", "adjoint", "--format", "json"]) == 0
    checks = {check["id"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert all(check["method"] == "numeric" and check["holds"] for check in checks.values())
    gap = float(checks["adjoint/fz-bdtdh/finite-difference"]["detail"].split("R = 1 ")[1].split()[0])
    assert 0 < gap < 1e-20


def test_the_finite_difference_gaps_pass_over_points_that_compare_nothing(monkeypatch):
    """``finite_difference_gaps`` tries the next seed where a comparison at a point is 0 against 0 (any of them: a
    block's adjoint and its sign-flipped control are compared at one point), and gives ``vacuous`` where every point
    tried is."""
    from splitformer.codegen.verification.statements import adjoint

    seeds = []

    def gaps_at(adjoints, seed, sizes, positive):
        seeds.append(seed)
        return [1e-30, None if len(seeds) < 3 else 2.0][-len(adjoints):]  # one adjoint: the second entry

    monkeypatch.setattr(adjoint, "_gaps_at", gaps_at)
    assert adjoint.finite_difference_gaps([None, None], "net/R = 1") == [1e-30, 2.0]
    assert seeds == ["net/R = 1", "net/R = 1#1", "net/R = 1#2"]
    seeds.clear()
    monkeypatch.setattr(adjoint, "_TRIES", 2)
    assert adjoint.finite_difference_gap(None, "net/R = 1", vacuous=None) is None and len(seeds) == 2
    seeds.clear()
    assert [float(gap) for gap in adjoint.finite_difference_gaps([None, None], "net/R = 1")] == [1e-30, 0.0]  # as before

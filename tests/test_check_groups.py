"""``splitformer check --only`` (``only=`` in Python): the groups partition the checks, each group runs its own
checks alone, and a name that is no group is one clear error."""

import json

import pytest

import splitformer
from splitformer.codegen.cli import main
from splitformer.codegen.verification.groups import GROUPS, check_groups
from splitformer.codegen.verification.runner import network_checks
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.network_spec import load_network

#: The first segment of the ids each group reports (for a scheme; a network's own statements are named by it).
_PREFIXES = {"semantics": ("semantics", "structure"), "recovery": ("recovery",), "adjoint": ("adjoint",),
             "causality": ("causality",), "adjoint-test": ("adjoint-test",), "order": ("order",),
             "convergence": ("convergence",)}


def test_the_groups_partition_a_schemes_checks():
    """Each group alone reports its own kind of check, and together they report what the whole check does, in
    the same order within each group."""
    derivation = splitformer.derive("pre-ln")
    everything = [check.id for check in derivation.check().checks]
    by_group = {group: [check.id for check in derivation.check(only=group).checks] for group in GROUPS
                if group != "general"}  # a derivation's check never ran the statements for every scheme
    for group, ids in by_group.items():
        assert ids and all(identifier.split("/")[0] in _PREFIXES[group] for identifier in ids), (group, ids)
        assert ids == [identifier for identifier in everything if identifier in ids]
    assert sorted(sum(by_group.values(), [])) == sorted(everything)


def test_a_networks_groups_split_its_statements_from_its_adjoint():
    spec = load_network("unet-level")
    recovery = [check.id for check in network_checks(spec, only=frozenset({"recovery"})).checks]
    adjoint = [check.id for check in network_checks(spec, only=frozenset({"adjoint"})).checks]
    assert recovery == ["unet-level/translation-equivariance", "unet-level/batch-norm-affine"]
    assert adjoint and all(identifier.startswith("adjoint/unet-level/") for identifier in adjoint), adjoint


def test_order_and_convergence_alone_from_the_command_line(capsys):
    assert main(["check", "rk2", "--only", "order, convergence", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [check["id"] for check in document["checks"]] == ["order/rk2", "convergence/rk2"]
    assert document["orders"]["rk2"]["order"] == 2


def test_convergence_alone_still_runs_at_the_series_order(capsys):
    """The study needs the order the trees give; the order check itself is not reported."""
    assert main(["check", "macaron", "--only", "convergence", "--format", "json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [check["id"] for check in checks] == ["convergence/macaron"]
    assert "(the scheme's own solvers) 1 from" in checks[0]["statement"]


def test_general_alone_runs_no_schemes_checks(capsys):
    assert main(["check", "post-ln", "--only", "general", "--format", "json"]) == 0
    ids = [check["id"] for check in json.loads(capsys.readouterr().out)["checks"]]
    assert "theorem-3.1/closed-form" in ids and "subdifferential/sign" in ids
    assert not [identifier for identifier in ids if "post-ln" in identifier]


def test_a_selection_that_leaves_no_check_is_an_error_not_a_success(capsys):
    """Attack 24: ``check vit --only order`` printed "0 passed, 0 failed" and exited 0: a success that proved nothing."""
    assert main(["check", "vit", "--only", "order,causality"]) == 2
    assert capsys.readouterr() == ("", "error: --only causality,order: no check of these groups applies to vit\n")
    with pytest.raises(SplitformerError, match="only: the general statements hold for every scheme and run with"):
        splitformer.derive("pre-ln").check(only="general")
    with pytest.raises(SplitformerError, match="only order: no check of these groups applies to resnet-block"):
        splitformer.derive("resnet-block").check(only="order")


@pytest.mark.parametrize("argv, message", [
    (["--only", "orders"], "error: --only: unknown group 'orders'; the groups: " + ", ".join(GROUPS) + "\n"),
    (["--only", " , "], "error: --only: no group given; the groups: " + ", ".join(GROUPS) + "\n"),
    (["--only", "order", "--plots", "plots"],
     "error: --plots: the plots are the convergence study's; add 'convergence' to --only\n"),
])
def test_a_bad_selection_is_one_line_and_status_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "post-ln", *argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message) and not (tmp_path / "plots").exists()


@pytest.mark.parametrize("only, message", [
    (3, "only: expected group names (a str or strs), got 3"), ([b"order"], "only: expected group names"),
    (["order", "trees"], "only: unknown group 'trees'"), ([], "only: no group given"),
])
def test_a_bad_selection_from_python_is_one_error(only, message):
    with pytest.raises(SplitformerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_groups(only)


def test_plots_need_the_convergence_group_in_python(tmp_path):
    with pytest.raises(SplitformerError, match="add 'convergence' to only"):
        splitformer.derive("post-ln").check(plots=tmp_path / "plots", only="order")
    assert not (tmp_path / "plots").exists()

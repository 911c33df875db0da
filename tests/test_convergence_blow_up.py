"""The convergence study where the flow itself blows up before T = 1 (a tester's field quadratic in an unnormalized
state, ``−g(y) ∫ χ (u(x̃, y) − u(x, y))² dx̃ / ∫ χ dη``): ``check`` reported "empirical order nan; errors nan, …" as a
failure with no reason. Now skipped, saying the flow is not finite; a scheme whose own steps blow up where the flow
does not still fails, saying so."""

import json
import math
import subprocess
import sys

from splitformer.codegen.verification.convergence import Study
from splitformer.codegen.verification.runner import convergence_check
from splitformer.symbolic import load_scheme

from conftest import post_ln_scheme

_PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import ETA, FEATURES, X, X_KEY, Y
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class Spread(Operator):
    """Minus a gain times the mean squared difference from the tokens a token sees."""

    kind: ClassVar[str] = "qa-spread"
    symbol: ClassVar[str] = r"\\mathcal{V}"

    def parameters(self):
        return (kernel("gain", "g", (Y,), (FEATURES,)),)

    def definitions(self):
        spread = integral(apply(SUPPORT, X, X_KEY) * (apply(STATE, X_KEY, Y) - apply(STATE, X, Y)) ** 2, X_KEY)
        return (Definition("out", self.symbol, (X, Y), -apply("gain", Y) * spread / integral(apply(SUPPORT, X, ETA), ETA),
                           "the spread"),)

    def uses_support(self):
        return True
'''



def test_a_flow_that_blows_up_is_not_measured(tmp_path):
    (tmp_path / "spread.py").write_text(_PLUGIN)
    (tmp_path / "spread.toml").write_text(post_ln_scheme("spread", "qa-spread"))
    result = subprocess.run([sys.executable, "-m", "splitformer", "check", "--load", str(tmp_path / "spread.py"),
                             str(tmp_path / "spread.toml"), "--only", "convergence", "--format", "json"],
                            capture_output=True, text=True, timeout=900)
    # every selected check skipped: a success that proved nothing was exit 0 (a tester); the report is printed
    assert result.returncode == 2 and result.stderr == ("error: nothing was checked: every selected check was skipped "
                                                        "(the report says why)\n"), result.stdout + result.stderr
    check = {check["id"]: check for check in json.loads(result.stdout)["checks"]}["convergence/spread"]
    assert check["method"] == "skipped" and "the flow itself blows up before T = 1" in check["detail"], check


def test_steps_that_blow_up_where_the_flow_does_not_fail():
    scheme = load_scheme("post-ln")
    blown = convergence_check(scheme, Study("post-ln", (1, 2, 4), (0.1, math.nan, math.inf), math.nan), 1)
    assert not blown.holds and blown.detail.startswith("the scheme's steps blow up where the flow does not")
    fine = convergence_check(scheme, Study("post-ln", (1, 2, 4), (0.4, 0.2, 0.1), 1.0), 1)
    assert fine.holds and fine.method == "numeric"

"""Where torch is not installed, the checks run what NumPy can and say what they skipped."""

import json
import os
import subprocess
import sys

from conftest import ROOT

#: Installed as ``sitecustomize`` in the child: ``import torch`` fails as if torch were not installed.
BLOCKER = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
'''

CHECKS = '''
import json, sys
try:
    import torch
    blocked = False
except ImportError:
    blocked = True
from splitformer.codegen.verification.scheme_checks import scheme_checks
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.scheme import Scheme, Sequence, Substep

scheme = Scheme("tiny", "one feed-forward", {"ffn": "feed-forward"}, Sequence((Substep("ffn", "explicit"),)))
checks = [(check.id, check.method, check.holds, check.detail) for check in scheme_checks(scheme, derive(scheme))]
print(json.dumps({"blocked": blocked, "torch_loaded": "torch" in sys.modules, "checks": checks}))
'''


def test_checks_without_torch_run_numpy_and_name_what_they_skipped(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True, cwd=ROOT, env=environment,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["blocked"] and not report["torch_loaded"]  # control: torch really is missing there
    checks = {identifier: (method, holds, detail) for identifier, method, holds, detail in report["checks"]}
    method, holds, detail = checks["semantics/tiny/emitted"]
    assert method == "numeric" and holds and "numpy, no mask" in detail and "torch, no mask" not in detail
    assert "the PyTorch module was not run: torch is not installed" in detail
    assert checks["semantics/tiny/emitted-torch"][:2] == ("skipped", True)
    assert "torch is not installed" in checks["semantics/tiny/emitted-torch"][2]
    assert checks["structure/tiny/stack"][1] and checks["semantics/tiny/derived"][1]


def test_a_torch_that_is_installed_but_does_not_import_is_said_so(tmp_path):
    """Attack 25: a torch whose library could not be loaded (unreadable, or too little memory) was "not installed":
    check skipped its torch module and passed, study said to pip install it. Both now say what failed, in one
    line, status 2. Control: a torch that is absent still skips (the test above)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        'raise ImportError("libtorch_python.so: cannot open shared object file: Permission denied")\n')
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for arguments in (["check", "post-ln", "--only", "semantics"],
                      ["study", "post-ln", "--steps", "1", "--seeds", "1", "--out", str(tmp_path / "study")]):
        result = subprocess.run([sys.executable, "-m", "splitformer", *arguments], capture_output=True, text=True,
                                cwd=ROOT, env=environment)
        assert result.returncode == 2 and result.stderr == (
            "error: torch is installed but cannot be imported: ImportError: libtorch_python.so: cannot open shared "
            "object file: Permission denied\n"), result.stderr
    assert not (tmp_path / "study").exists()

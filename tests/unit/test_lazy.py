"""Lazy package exports (attn_core/lazy.py): every exported name resolves to what its submodule
defines, the configs and constants import no torch, and a name that is also its submodule's name
stays the exported function whichever is imported first (fresh processes, so nothing is loaded
before)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAZY = ["model", "regularizers", "circuits", "grow", "qk", "text"]


def run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.parametrize("package", LAZY)
def test_every_exported_name_is_what_its_module_defines(package):
    pkg = importlib.import_module(f"attn_core.{package}")
    assert pkg.__all__ and set(pkg.__all__) <= set(dir(pkg))
    for name in pkg.__all__:
        value = getattr(pkg, name)
        assert value is not None, name
        home = getattr(value, "__module__", None)
        if home is not None and home.startswith("attn_core."):
            assert getattr(importlib.import_module(home), name) is value, name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


def test_configs_and_constants_import_no_torch():
    out = run(
        "import sys\n"
        "import attn_core.training.config, attn_core.training.checkpoint_plan, attn_core.device\n"
        "import attn_core.grow.config, attn_core.qk.config, attn_core.training.text_defaults, attn_core.circuits.settings\n"
        "from attn_core.model import ModelConfig\n"
        "from attn_core.regularizers import parse_specs, parse_heads\n"
        "from attn_core.training.config import JobConfig\n"
        "parse_specs(['entropy@L1=0.1']), JobConfig.__dataclass_fields__['steps'].default\n"
        "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    )
    assert out == "[]"


def test_loading_a_model_does_not_import_the_compiler():
    """The checks build the model on the meta device; drawing its initial weights there went
    through torch._refs and imported torch._dynamo: seconds of every command's and page's first
    load. A loaded model still computes what the weights say."""
    out = run(
        "import sys, torch\n"
        "from attn_core.sources import resolve\n"
        "loaded = resolve('induction-2l')\n"
        "logits = loaded.model(torch.tensor([[1, 2, 3]]))\n"
        "print('torch._dynamo' in sys.modules, bool(torch.isfinite(logits).all()))"
    )
    assert out == "False True"


@pytest.mark.parametrize("first", ["the submodule", "the package"])
def test_a_name_that_is_its_submodules_name_stays_the_function(first):
    imports = [
        "import attn_core.circuits.composition",
        "from attn_core.circuits import composition",
    ]
    if first == "the package":
        imports.reverse()
    out = run(
        "\n".join(imports) + "\nimport attn_core.circuits as c\nimport types\n"
        "print(isinstance(c.composition, types.FunctionType), isinstance(composition, types.FunctionType))"
    )
    assert out == "True True"


def test_a_lazy_package_pickles_as_itself():
    """Ray ships functions by cloudpickle: one that refers to a lazy package pickles it by name."""
    import pickle

    from ray import cloudpickle

    from attn_core import regularizers as R

    assert pickle.loads(pickle.dumps(R)) is R
    fn = cloudpickle.loads(cloudpickle.dumps(lambda specs: R.parse_specs(specs)))
    assert [str(s) for s in fn(["entropy@L1=0.1"])] == ["entropy@L1=0.1"]


def test_an_error_while_a_lazy_module_loads_is_not_hidden(tmp_path):
    """An AttributeError raised inside the submodule would reach Python's import machinery as
    "cannot import name" with no cause: it is raised as an ImportError that says what failed."""
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from attn_core import lazy\n__getattr__, __dir__ = lazy.exports(__name__, {'broken': ('thing',)})\n"
    )
    (pkg / "broken.py").write_text("import math\nthing = math.no_such_function()\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "try:\n    from lazypkg import thing\nexcept ImportError as e:\n    print(e, '|', repr(e.__cause__))\n"
    )
    out = run(code)
    assert "importing lazypkg.broken failed" in out and "no_such_function" in out, out

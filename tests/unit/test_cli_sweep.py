"""`attn-lab sweep`, `sweeps` and `sweeps show`: bad input is one line on stderr and exit code 2,
before Ray starts or anything is written."""

import json

import pytest
import typer
from typer.testing import CliRunner

from attn_core.runs import RunStore

pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)


def sweep_cli() -> typer.Typer:
    from attn_core.cli import sweep

    app = typer.Typer(add_completion=False)
    app.add_typer(sweep.app)
    app.add_typer(sweep.sweeps_app, name="sweeps")
    return app


def invoke(*args):
    return CliRunner().invoke(sweep_cli(), list(args))


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--grid", "nope=0.1"], "error: unknown regularizer 'nope' in the grid; known: entropy"),
        ([], "error: the grid is empty"),
        (["--grid", "entropy=0.1,x"], "error: lambda 'x' of entropy in the grid is not a number > 0"),
        (["--grid", "entropy=0.1", "--seeds", "0"], "error: --seeds must be a positive integer"),
        (
            ["--grid", "entropy=0.1", "--address", "ray://127.0.0.1:1"],
            "error: cannot reach the Ray cluster at ray://127.0.0.1:1",
        ),
        (["--grid", "entropy=0.1", "--address", "not-an-address"], "error: --address 'not-an-address' is not auto"),
        (["--grid", "entropy=0.1", "--scheduler", "magic"], "error: --scheduler must be one of none, asha"),
        (["--grid", "entropy=0.1", "--gpus-per-trial", "-1"], "error: --gpus-per-trial must be >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, msg):
    out = invoke("sweep", "reverse-1l", *args, "--json")
    assert out.exit_code == 2, out.output
    assert json.loads(out.stdout)["error"] in out.stderr  # --json: the error as JSON too
    # the one-line message is the last line (a library warning may come before it), no traceback
    assert out.stderr.strip().splitlines()[-1].startswith(msg) and "Traceback" not in out.stderr, out.stderr
    assert RunStore().list_sweeps() == []  # nothing was written


def test_sweeps_listing_and_show():
    assert json.loads(invoke("sweeps", "--json").stdout) == []
    out = invoke("sweeps", "show", "sweep-nope", "--json")
    assert out.exit_code == 2 and out.stderr.startswith("error: no sweep 'sweep-nope'")

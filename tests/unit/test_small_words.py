"""Smaller things a new user saw (issue 37, item 10): heatmap cell numbers that ran together on a
typed text; a space token labelled "7:"; the normalized entropy chart's step axis past the run's
last step; export-hf's help naming only GPT-2; the README's test command without a venv."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from attn_core import bilinear
from attn_core.figures import bilinear as fb
from attn_core.figures import training as ft
from attn_core.figures.layout import FULL_PX, HALF_PX
from attn_core.sources import resolve

ROOT = Path(__file__).resolve().parents[2]


def heat(plot):
    return next(t for t in plot.fig.data if t.type == "heatmap")


@pytest.mark.parametrize("n", [12, 20])
def test_cell_numbers_are_written_only_where_they_fit(n):
    loaded = resolve("induction-2l")
    tokens = torch.randint(0, loaded.config.d_vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    view = bilinear.sequence_view(loaded, tokens, 0, [0])
    assert heat(fb.view_plot(view, 0, width=HALF_PX)).texttemplate is None  # "-0.02-0.01": no room
    short = bilinear.sequence_view(loaded, tokens[:6], 0, [0])
    assert heat(fb.view_plot(short, 0, width=FULL_PX)).texttemplate  # wide cells keep their numbers


def test_a_space_token_has_a_visible_label():
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models

    from attn_core.hf.tokenizer import token_strings

    tok = Tokenizer(models.WordLevel({"a": 0, " ": 1, "  ": 2, "\t": 3}, unk_token="a"))
    labels = token_strings(tok, 4)
    assert labels[1] == "␣" and labels[2] == "␣␣" and labels[3] == "\\t"


def test_the_entropy_chart_ends_at_the_last_step():
    rows = [(s, f"entropy_data:L0H{h}", 0.5) for s in (0, 50, 100, 150) for h in (0, 1)]
    rows += [(s, "entropy_data", 0.5) for s in (0, 50, 100, 150)]
    metrics = pd.DataFrame(rows, columns=["step", "name", "value"])
    fig = ft.head_entropy_plot(metrics, "data").fig
    assert list(fig.layout.xaxis.range) == [0, 150]


def test_export_hf_help_names_every_family():
    from typer.testing import CliRunner

    from attn_core.cli import app

    out = CliRunner().invoke(app, ["--help"]).stdout
    line = " ".join(out.split("export-hf", 1)[1].split()[:12])
    assert "GPT-2 folder" not in line and "Hugging Face" in line, line


def test_the_readme_makes_a_venv_before_the_tests_and_ci_runs_the_script_alone():
    readme = (ROOT / "README.md").read_text()
    block = next(
        b.split("```", 1)[0] for b in readme.split("```bash\n")[1:] if "bash scripts/test.sh" in b.split("```", 1)[0]
    )
    assert block.index("python3 -m venv .venv") < block.index("bash scripts/test.sh")
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # CI: system Python, no venv

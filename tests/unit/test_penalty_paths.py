"""A penalty says how each of its specs was computed at its last step (the fused attention pass,
query blocks, the pattern's rows of a soft-capped model, the vocabulary view or the spectrum), and
what it says is the path the row engine takes (``rows.fused_kernel``)."""

import pytest
import torch

from attn_core.regularizers import build_penalty
from attn_core.regularizers import rows as R
from tests.conftest import make_tiny_model


def step(model, specs, **options):
    penalty = build_penalty(specs.split(","), model, **options)
    cache = penalty.cache()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, model.cfg.n_ctx))
    model(tokens, cache=cache)
    total = sum(penalty(model, cache=cache).values())
    total.backward()  # the path named is one whose gradient runs
    return penalty.paths


def test_each_spec_names_its_path_on_the_cpu():
    model = make_tiny_model(n_layers=2)
    paths = step(model, "entropy@L0=0.1,topk:2@L1=0.1,vocab_entropy=0.1,spectral=0.1")
    assert paths == {
        "entropy@L0": "fused attention pass (cpu)",
        "topk:2@L1": "query blocks",  # top-k mass has no closed form on the fused pass
        "vocab_entropy": "the vocabulary's rows (V x V)",
        "spectral": "the singular values of B",
    }


@pytest.mark.parametrize(
    ("options", "said"),
    [({"path": "blocked"}, "query blocks"), ({"rows": 3}, "query blocks (sampled rows)")],
)
def test_the_blocked_path_and_sampled_rows_are_said(options, said):
    assert step(make_tiny_model(), "entropy=0.1", **options) == {"entropy": said}


def test_a_soft_capped_model_reads_its_patterns_rows():
    model = make_tiny_model(attn_softcap=4.0)
    assert step(model, "entropy=0.1") == {"entropy": "the pattern's rows (after the soft cap)"}


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("window", [0, 3])
def test_what_is_said_is_the_kernel_the_engine_takes(device, window):
    q = torch.empty(1, 2, 8, 16, device=device)
    kernel = R.fused_kernel(q, "entropy", window, None, None, 1.0, "auto")
    assert R.row_path(q, "entropy", window, 1.0, None, "auto") == f"fused attention pass ({kernel})"
    assert R.row_path(q, "entropy", window, 1.0, None, "blocked") == "query blocks"
    assert R.row_path(q, "entropy", window, 1.5, None, "auto") == "query blocks"  # entmax rows


def test_retrain_says_how_each_penalty_was_computed(tmp_path):
    """The retrain command prints, and the run's card keeps, the path each penalty took."""
    import json

    from typer.testing import CliRunner

    from attn_core import checkpoint
    from attn_core.cli import app
    from attn_core.runs import RunStore

    folder = str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse"}))
    args = ["retrain", folder, "--reg", "entropy=0.5", "--reg", "topk:2=0.5", "--steps", "2", "--device", "cpu"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "penalties computed by entropy: fused attention pass (cpu); topk:2: query blocks" in res.stdout
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert out["penalty_paths"] == {"entropy": "fused attention pass (cpu)", "topk:2": "query blocks"}
    card = RunStore().load_model(out["run_id"]).card
    assert card.details["penalty_paths"] == out["penalty_paths"]

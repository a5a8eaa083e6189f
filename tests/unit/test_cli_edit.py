"""attn-lab edit and diff: one JSON document each with the library's numbers, the edited model
saved where every command opens it (an imported folder as its own family), and bad input refused
in one line with exit code 2, nothing saved changed."""

from __future__ import annotations

import pytest
import torch

from attn_core.destinations import SHIPPED
from attn_core.sources import resolve
from attn_core.surgery import HeadEdit, edit_inputs, edit_metrics, edit_model, head_form64
from tests.conftest import cli_json, cli_run, one_line_error

run, run_json = cli_run, cli_json


@pytest.fixture(scope="module")
def gpt2(gpt2_with_text):
    return gpt2_with_text


def test_edit_json_is_the_librarys_before_and_after(tmp_path):
    r = run_json(
        "edit",
        "induction-2l",
        "--head",
        "L1H0",
        "--rank",
        1,
        "--head",
        "L0H1",
        "--scale-modes",
        "0=0.5,1=0",
        "--samples",
        16,
    )
    assert r["edits"] == [{"head": "L1H0", "rank": 1}, {"head": "L0H1", "scale_modes": {"0": 0.5, "1": 0.0}}]
    loaded = resolve("induction-2l")
    inputs = edit_inputs(loaded, samples=16)
    edits = [HeadEdit(1, 0, rank=1), HeadEdit(0, 1, scale=((0, 0.5), (1, 0.0)))]
    after = edit_metrics(edit_model(loaded, edits).loaded, inputs, [(1, 0), (0, 1)])
    for k in ("loss", "perplexity", "accuracy", "icl_score", "sink_rate"):
        assert r["after"][k] == pytest.approx(after[k], rel=1e-6, abs=1e-9), k
        assert k in r["before"]
    assert r["after"]["loss"] > r["before"]["loss"]
    assert r["after"]["heads"]["L1H0"]["sigma_1"] == pytest.approx(r["before"]["heads"]["L1H0"]["sigma_1"])
    assert r["after"]["heads"]["L0H1"]["sigma_1"] < r["before"]["heads"]["L0H1"]["sigma_1"]
    for head, v in after["heads"].items():
        assert r["after"]["heads"][head] == pytest.approx(v)
    human = run("edit", "induction-2l", "--head", "L1H0", "--ablate", "zero", "--samples", 8)
    assert human.exit_code == 0 and "perplexity" in human.stdout and "L1H0 sigma_1" in human.stdout


def test_out_saves_a_model_every_command_opens_and_diff_finds_the_edited_head(tmp_path):
    out = tmp_path / "edited"
    r = run_json("edit", "induction-2l", "--head", "L1H1", "--drop-modes", "0", "--samples", 8, "--out", out)
    assert r["out"] == {"out": str(out), "format": "attn-lab"}
    saved = resolve(str(out))
    assert saved.card.parent == "induction-2l" and saved.card.task == "induction"
    assert saved.card.details["job"]["edits"] == [{"head": "L1H1", "drop_modes": [0]}]
    d = run_json("diff", "induction-2l", out)
    dist = {(p["layer"], p["head_a"], p["head_b"]): p["distance"] for p in d["pairs"]}
    assert all(dist[(l, h, h)] < 1e-7 for l in range(2) for h in range(4) if (l, h) != (1, 1))
    assert dist.get((1, 1, 1), 1.0) > 1e-3 and d["unmatched"] == []
    assert d["distance"].startswith("relative Frobenius")
    human = run("diff", "induction-2l", out, "--layers", "1")
    assert human.exit_code == 0 and "unmatched: none" in human.stdout


def test_an_imported_folder_is_saved_as_its_own_family_with_a_transplant(gpt2, tmp_path):
    folder, text = gpt2
    out = tmp_path / "edited-gpt2"
    r = run_json(
        "edit", folder, "--text", text, "--samples", 4, "--head", "L0H1", "--from", f"{folder}:L1H2", "--with-ov",
        "--head", "L1H0", "--ablate", "mean", "--out", out,
    )  # fmt: skip
    assert r["out"]["format"] == "gpt2" and (out / "config.json").is_file() and r["before"]["accuracy"] is None
    again, orig = resolve(str(out)), resolve(str(folder))
    assert torch.allclose(head_form64(again.model, 0, 1).dense, head_form64(orig.model, 1, 2).dense, atol=1e-6)
    assert float(again.model.blocks[1].attn.W_O[0].detach().abs().max()) == 0.0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--head", "L5H0", "--rank", "1"], ["out of range"]),
        (["--head", "L1H0", "--rank", "17"], ["--rank 17", "out of range"]),
        (["--head", "L1H0", "--drop-modes", "16"], ["mode index 16"]),
        (["--head", "L1H0", "--scale-modes", "0=x"], ["not a number"]),
        (["--head", "L1H0"], ["nothing to do"]),
        (["--rank", "1"], ["must follow"]),
        (["--head", "L1H0", "--ablate", "mean"], ["output bias"]),
        (["--head", "L1H0", "--from", "copy-1l"], ["cannot transplant"]),
        (["--head", "L1H0", "--from", "no-such-model"], ["no-such-model"]),
        (["--head", "L1H0", "--rnak", "1"], ["unexpected argument"]),
    ],
)
def test_bad_edits_are_one_line_and_exit_2(args, words):
    one_line_error(run("edit", "induction-2l", *args), *words)


def test_a_bad_out_is_refused_and_nothing_saved_changes(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    one_line_error(run("edit", "induction-2l", "--head", "L1H0", "--rank", 1, "--out", existing), "already exists")
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    one_line_error(
        run("edit", "induction-2l", "--head", "L1H0", "--rank", 1, "--out", SHIPPED / "models" / "x"), "shipped"
    )
    model = tmp_path / "m"
    assert run("edit", "induction-2l", "--head", "L1H0", "--rank", 1, "--samples", 4, "--out", model).exit_code == 0
    one_line_error(
        run("edit", "induction-2l", "--head", "L1H0", "--rank", 1, "--out", model / "in"), "inside the model"
    )
    one_line_error(run("diff", "induction-2l", "copy-1l"), "d_model")
    one_line_error(run("diff", "induction-2l", model, "--layers", "7"), "--layers")


def test_a_transplant_source_keeps_a_runs_colon():
    from attn_core.cli.edit import _source

    assert _source("run:20260101-120000-ab12") == ("run:20260101-120000-ab12", None)
    assert _source("run:20260101-120000-ab12:L1H0") == ("run:20260101-120000-ab12", "L1H0")
    assert _source("induction-2l:l0h3") == ("induction-2l", "l0h3")
    assert _source("/models/a:b") == ("/models/a:b", None)


def test_diff_of_gpt2_folders_with_different_head_widths_matches_in_b_space(tmp_path):
    """Two GPT-2 folders of one d_model (32), 4 heads x 8 and 8 heads x 4: diff compares their
    heads' B (d_model x d_model), pairs four heads per layer and names the four left over."""
    transformers = pytest.importorskip("transformers")
    a, b = tmp_path / "GPT2_4x8", tmp_path / "GPT2_8x4"
    for folder, heads in ((a, 4), (b, 8)):
        torch.manual_seed(heads)
        cfg = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=heads, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0
        )
        transformers.GPT2LMHeadModel(cfg).save_pretrained(folder, safe_serialization=True)
    d = run_json("diff", a, b)
    assert len(d["pairs"]) == 8 and len(d["unmatched"]) == 8 and {u["model"] for u in d["unmatched"]} == {"b"}
    assert all(0.0 <= p["distance"] <= 1.0 for p in d["pairs"])
    assert [len(row) for row in d["matrices"]["0"]] == [8] * 4
    human = run("diff", b, a, "--layers", "1")
    assert human.exit_code == 0 and "unmatched: GPT2_8x4:L1H" in human.stdout, human.output


@pytest.mark.parametrize("scale", ["1e7", "3e38"])
def test_an_edit_whose_weights_no_loader_accepts_is_refused_before_anything_is_written(tmp_path, scale):
    """A scale that leaves W_Q beyond the loaders' bound (checkpoint.MAX_ABS_WEIGHT) is refused
    in one line naming the tensor and the bound, before anything is measured (3e38 would make the
    linear algebra fail) and before --out is written (a folder no command could open)."""
    out = tmp_path / "edited"
    err = one_line_error(
        run("edit", "induction-2l", "--head", "L0H0", "--scale-modes", f"0={scale}", "--samples", 4, "--out", out),
        "L0H0",
        "blocks.0.attn.W_Q",
        "beyond 1e+06",
    )
    assert "unexpected" not in err and not out.exists()
    import attn_core as al

    with pytest.raises(ValueError, match="no loader accepts"):
        al.edit(al.load("induction-2l"), "L0H0", scale={0: 1e30}, samples=4)


def test_edit_refuses_a_length_it_would_not_use_and_names_the_model_in_head_errors():
    one_line_error(run("edit", "induction-2l", "--head", "L0H0", "--rank", 1, "--length", 0), "--length", "0")
    one_line_error(run("edit", "induction-2l", "--head", "L0H0", "--rank", 1, "--length", 8), "--length", "--text")
    err = one_line_error(run("edit", "induction-2l", "--head", "L9H0", "--rank", 1), "induction-2l", "L9")
    assert "the model" not in err


def test_a_linear_algebra_failure_is_one_line_not_an_internal_error(monkeypatch):
    """torch's LinAlgError is torch._C._LinAlgError: the handler knows it by class, not by name."""
    import attn_core.surgery

    def fails(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(attn_core.surgery, "edit_metrics", fails)
    one_line_error(run("edit", "induction-2l", "--head", "L0H0", "--rank", 1, "--samples", 4), "linear algebra failed")

"""Checkpoint series a user already has (issue 30, part 3): a folder of Hugging Face folders, one per
checkpoint, written here by transformers from a run trained here (each checkpoint exported with
export-hf, then loaded and saved by transformers), named by step or listed in a manifest with
tokens; measured against the run's own checkpoints; damaged members skipped with their reason.
And a text run's tokenizer in its checkpoints folder from its start."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from attn_core import checkpoint
from attn_core import dynamics as D
from attn_core.dynamics import folders
from attn_core.hf.export import export_gpt2
from attn_core.retraining.job import TrainingJob
from attn_core.training.config import JobConfig
from tests.conftest import make_tiny_model

transformers = pytest.importorskip("transformers")
STEPS = [0, 2, 4, 6]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(the run's source, a folder of step<N>/ Hugging Face folders saved by transformers, a text)."""
    root = tmp_path_factory.mktemp("hf-series")
    src = checkpoint.save(make_tiny_model(n_layers=2), root / "tiny", {"task": "reverse", "train": {"batch_size": 8}})
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTN_LAB_RUNS", str(root / "runs"))
    try:
        cfg = JobConfig(str(src), steps=6, lr=3e-2, device="cpu", telemetry_every=6, spectrum_every=6, eval_every=6,
                        eval_samples=8, probe_samples=4, measure_samples=8, checkpoint_every=2)  # fmt: skip
        run = f"run:{TrainingJob.open(cfg).run()['run_id']}"
        own = D.series([run])
        assert own.steps == STEPS
        series = root / "pythia-like"
        for step in STEPS:
            loaded = own.load(step)
            export_gpt2(loaded, root / f"export{step}", token_names=list(loaded.task.token_names))
            hf = transformers.GPT2LMHeadModel.from_pretrained(root / f"export{step}")
            hf.save_pretrained(series / f"step{step}", safe_serialization=True)
            for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"):
                shutil.copy(root / f"export{step}" / name, series / f"step{step}" / name)
        text = root / "digits.txt"
        g = torch.Generator().manual_seed(0)
        text.write_text(" ".join(loaded.task.token_names[int(i)] for i in torch.randint(0, 10, (600,), generator=g)))
        yield run, series, text
    finally:
        mp.undo()


def cli(capsys, *args) -> tuple[int, str, str]:
    from attn_core.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_a_folder_of_hf_folders_is_measured_like_the_run_it_came_from(written, capsys, monkeypatch):
    run, series, text = written
    monkeypatch.setenv("ATTN_LAB_RUNS", str(series.parent / "runs"))
    args = ("--text", str(text), "--length", "16", "--samples", "8", "--detector-samples", "4", "--json")
    code, out, err = cli(capsys, "dynamics", str(series), *args)
    assert code == 0, err
    hf = json.loads(out)
    code, out, err = cli(capsys, "dynamics", run, *args)
    assert code == 0, err
    own = json.loads(out)
    assert hf["steps"] == own["steps"] == STEPS and hf["skipped"] == [] and hf["tokens"] is None
    for name in ("loss", "icl_score", "prefix_matching:L1H0", "previous_token:L0H1", "entropy_data:L1H1"):
        assert hf["metrics"][name] == pytest.approx(own["metrics"][name], abs=1e-4), name


def test_a_manifest_gives_steps_and_tokens_and_bad_members_are_skipped(written, tmp_path, capsys):
    _, series, text = written
    folder = Path(shutil.copytree(series, tmp_path / "olmo-like"))
    (folder / "step4" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")  # damaged
    (tmp_path / "outside").mkdir()
    rows = [(0, 0, "step0"), (2, 4096, "step2"), (4, 8192, "step4"), (6, 12288, "step6"), (8, 1, "../outside"),
            ("x", 5, "step0")]  # fmt: skip
    (folder / "series.csv").write_text("step,tokens,folder\n" + "".join(f"{s},{t},{f}\n" for s, t, f in rows))
    code, out, err = cli(capsys, "dynamics", str(folder), "--text", str(text), "--length", "16", "--samples", "4",
                         "--detector-samples", "4", "--json")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["steps"] == [0, 2, 6] and res["tokens"] == [0, 4096, 12288]
    reasons = {(s["step"], s["reason"].split(" (")[0]) for s in res["skipped"]}
    assert (8, "'../outside' leads outside the model folder olmo-like") in reasons
    assert (None, "its step 'x' is not a whole number >= 0") in reasons
    assert any(s["step"] == 4 and "model.safetensors" in s["reason"] for s in res["skipped"])
    assert "skipped step 4 (step4):" in err and "Traceback" not in err


def test_names_and_json_manifests(tmp_path):
    assert folders.step_and_tokens("step20000-tokens84B") == (20000, 84 * 10**9)
    assert folders.step_and_tokens("pythia-70m-step143000") == (143000, None)
    assert folders.step_and_tokens("final") == (None, None)
    (tmp_path / "a").mkdir()
    (tmp_path / "series.json").write_text(json.dumps({"checkpoints": [
        {"step": 5, "tokens": 50, "folder": "a"}, {"step": 6, "folder": "a"}, {"step": 10**12, "folder": "a"},
        {"folder": 3}, {"step": 7, "tokens": -1, "folder": "a"}]}))  # fmt: skip
    found, problems = folders.entries(tmp_path, 100)
    assert [(e.step, e.tokens, e.folder.name) for e in found] == [(5, 50, "a")]
    assert [p[2].split(" (")[0] for p in problems] == [
        "names no folder", "is named twice", "its step 1,000,000,000,000 is past 10,000,000, the most steps of a run",
        "its tokens '-1' are not a whole number >= 0"]  # fmt: skip
    (tmp_path / "series.json").write_text("[" * 100)
    with pytest.raises(ValueError, match="not valid JSON"):
        folders.entries(tmp_path, 100)


def test_a_text_run_writes_its_tokenizer_beside_its_checkpoints_when_it_starts(written, tmp_path, capsys):
    """A text run killed before its final save (only checkpoints/ left) is measured on text."""
    from attn_core.runs import RunStore

    _, series, text = written
    cfg = JobConfig(str(series / "step6"), text=str(text), block=8, steps=2, checkpoint_every=1, batch_size=4,
                    eval_every=2, telemetry_every=2, spectrum_every=2)  # fmt: skip
    run_id = TrainingJob.open(cfg).run()["run_id"]
    folder = RunStore().path(run_id)
    assert (folder / "checkpoints" / "tokenizer.json").read_bytes() == (
        series / "step6" / "tokenizer.json"
    ).read_bytes()
    for p in folder.iterdir():  # what a kill before the final save leaves
        if p.name != "checkpoints":
            p.unlink()
    code, out, err = cli(capsys, "dynamics", f"run:{run_id}", "--text", str(text), "--length", "8", "--samples", "4",
                         "--detector-samples", "4", "--json")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["steps"] == [0, 1, 2] and all(v is not None for v in res["metrics"]["loss"])

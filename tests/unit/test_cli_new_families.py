"""Every analysis command on each newer family (tiny random folders made by transformers here, with
a word-level tokenizer.json): it runs, or, where the family's attention makes the analysis
something other than the model's maths, refuses in one sentence naming why (exit 2)."""

import json

import pytest

pytest.importorskip("transformers")

import attn_core as al  # noqa: E402
from attn_core.cli import main  # noqa: E402
from tests.unit.test_hf_new_families import FAMILIES, write_family  # noqa: E402

WORDS = ["[UNK]"] + [f"w{i}" for i in range(1, 100)]
PER_HEAD_NORM = {"qwen3", "gemma3_text", "exaone4", "qwen3_moe"}  # QK-norm weights shared by a layer's heads
SINKS = {"gpt_oss"}  # learned sinks: the vocabulary view's rows leave them out
# command -> the families that refuse it, each with the words its refusal gives
REFUSED = {
    "edit": dict.fromkeys(PER_HEAD_NORM, "shared by every head of the layer"),  # --ablate works (edit-ablate)
    "retrain-vocab": dict.fromkeys(SINKS, "learned sink"),
}
DATA_AND_SPECTRUM = ["entropy@L0=0.1", "hoyer=0.1", "topk:2=0.1", "sink=0.1", "spectral=0.01", "nuclear=0.01"]
VOCAB = ["vocab_entropy=0.1", "vocab_hoyer=0.1", "vocab_topk:2=0.1"]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp(request.param)
    write_family(root, request.param, max_position_embeddings=2048)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    text = root.parent / f"{request.param}.txt"
    text.write_text(" ".join(WORDS[1 + (i * 7) % 99] for i in range(1100)))  # long: the blocked path
    _series(root, root.parent / f"{root.name}-series")
    return request.param, root, text


def _series(folder, series):
    """A checkpoint series of the folder: step0 (itself) and step10 (every weight moved)."""
    import shutil

    from safetensors.torch import load_file, save_file

    for step in (0, 10):
        shutil.copytree(folder, series / f"step{step}")
    weights = series / "step10" / "model.safetensors"
    moved = {k: (v.float() * 0.9 + 0.01).to(v.dtype) for k, v in load_file(weights).items()}
    save_file(moved, weights, metadata={"format": "pt"})


def regs(specs):
    return [x for spec in specs for x in ("--reg", spec)]


def run(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def commands(folder, text, tmp):
    return {
        "spectrum": ["spectrum", folder, "--json"],
        "ranks": ["spectrum", folder, "--text", text, "--json"],  # data-space ranks on text probes
        "scores": ["scores", folder, "--layer", 1, "--head", 2, "--tokens", "w1 w2 w3 w4 w1 w2 w3", "--json"],
        "long-scores": [
            "scores",
            folder,
            "--layer",
            1,
            "--head",
            0,
            "--text",
            text,
            "--length",
            1100,
            "--topk",
            4,
            "--json",
        ],  # fmt: skip
        "heads": ["heads", folder, "--json"],
        "sinks": ["sinks", folder, "--text", text, "--samples", 4, "--length", 32, "--json"],
        "circuits": ["circuits", folder, "--json"],
        "attribute": ["attribute", folder, "--layer", 1, "--head", 0, "--tokens", "w1 w2 w3 w4", "--json"],
        "edit": [
            "edit",
            folder,
            "--head",
            "L1H0",
            "--rank",
            2,
            "--text",
            text,
            "--samples",
            2,
            "--length",
            16,
            "--out",
            tmp / "edited",
            "--json",
        ],  # fmt: skip
        "edit-ablate": [
            "edit",
            folder,
            "--head",
            "L1H0",
            "--ablate",
            "zero",
            "--text",
            text,
            "--samples",
            2,
            "--length",
            16,
            "--out",
            tmp / "ablated",
            "--json",
        ],  # fmt: skip
        "diff": ["diff", folder, folder, "--json"],
        "dynamics": [
            "dynamics",
            folder.parent / f"{folder.name}-series",
            "--text",
            text,
            "--length",
            16,
            "--samples",
            4,
            "--detector-samples",
            4,
            "--no-cache",
            "--json",
        ],  # fmt: skip
        "export-hf": ["export-hf", folder, "--out", tmp / "exported", "--json"],
        "retrain": [
            "retrain",
            folder,
            "--text",
            text,
            "--block",
            10,
            "--steps",
            2,
            *regs(DATA_AND_SPECTRUM),
            "--json",
        ],  # fmt: skip
        "retrain-vocab": [
            "retrain",
            folder,
            "--text",
            text,
            "--block",
            10,
            "--steps",
            2,
            *regs(VOCAB),
            "--json",
        ],  # fmt: skip
    }


@pytest.mark.parametrize(
    "command",
    [
        "spectrum",
        "ranks",
        "scores",
        "long-scores",
        "heads",
        "sinks",
        "circuits",
        "attribute",
        "edit",
        "edit-ablate",
        "diff",
        "dynamics",
        "export-hf",
        "retrain",
        "retrain-vocab",
    ],
)
def test_each_command_runs_or_refuses_in_one_sentence(folder, command, capsys, tmp_path, monkeypatch):
    family, root, text = folder
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    code, out, err = run(capsys, *commands(root, text, tmp_path)[command])
    refusing = REFUSED.get(command, {})
    if family in refusing:
        errors = [line for line in err.splitlines() if line.startswith("error:")]  # progress lines aside
        assert code == 2 and len(errors) == 1 and refusing[family] in errors[0], err
    else:
        assert code == 0, err
        json.loads(out)


def test_al_load_opens_each_family(folder):
    family, root, _ = folder
    model = al.load(str(root))
    assert model.config.n_layers == 2 and model.card.details["architecture"] == family

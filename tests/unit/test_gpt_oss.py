"""gpt-oss beyond parity: a head's learned sink edited (``edit --sink``, ``al.edit(sink=)``) with
before/after, ``diff`` reporting sink changes, and a retrain on text that moves the sinks, the
router's bias and the experts' biases and exports back to gpt-oss with the logits attn-lab computes."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

import attn_core as al  # noqa: E402
from attn_core.cli import main  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from tests.unit.test_cli_new_families import WORDS  # noqa: E402
from tests.unit.test_hf_new_families import write_family  # noqa: E402


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("gpt_oss")
    write_family(root, "gpt_oss", max_position_embeddings=256)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    text = root.parent / "oss.txt"
    text.write_text(" ".join(WORDS[1 + (i * 7) % 99] for i in range(600)))
    return root, text


def run(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_edit_zeroes_a_heads_sink_logit_and_measures_before_and_after(oss, capsys, tmp_path):
    root, text = oss
    out = tmp_path / "edited"
    args = ["edit", root, "--head", "L1H0", "--sink", 0, "--text", text, "--samples", 2, "--length", 16]
    code, stdout, err = run(capsys, *args, "--out", out, "--json")
    assert code == 0, err
    r = json.loads(stdout)
    before, after = r["before"]["heads"]["L1H0"], r["after"]["heads"]["L1H0"]
    assert before["sink"] != 0.0 and after["sink"] == 0.0
    assert before["sink_share"] != after["sink_share"] and r["edits"] == [{"head": "L1H0", "sink": 0.0}]
    was, now = load_file(root / "model.safetensors"), load_file(out / "model.safetensors")
    name = "model.layers.1.self_attn.sinks"
    assert float(now[name][0]) == 0.0 and torch.equal(now[name][1:], was[name][1:])
    assert all(torch.equal(now[k], was[k]) for k in was if k != name)  # nothing else moved
    code, stdout, err = run(capsys, "diff", root, out, "--json")
    assert code == 0, err
    pairs = {(p["layer"], p["head_a"]): p for p in json.loads(stdout)["pairs"]}
    assert pairs[(1, 0)]["sink_change"] == pytest.approx(-float(was[name][0]))
    assert all(p["sink_change"] == 0.0 for k, p in pairs.items() if k != (1, 0))
    assert all(p["distance"] < 1e-6 for p in pairs.values())  # B is untouched: the sink is outside it


def test_the_python_edit_scales_a_sink(oss):
    root, text = oss
    r = al.edit(al.load(str(root)), "L0H2", sink=2.0, text=str(text), samples=2, length=16)
    assert r.after["heads"]["L0H2"]["sink"] == pytest.approx(2 * r.before["heads"]["L0H2"]["sink"])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sink", "nan"], "--sink of head L0H0 must be a finite number"),
        (["--sink", "big"], "--sink takes a number"),
    ],
)
def test_a_bad_sink_factor_exits_2_naming_it(oss, capsys, args, words):
    root, text = oss
    code, _, err = run(capsys, "edit", root, "--head", "L0H0", *args, "--text", text, "--samples", 2, "--length", 8)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and words in errors[0], err


def test_a_sink_edit_of_a_model_without_sinks_exits_2(capsys):
    code, _, err = run(capsys, "edit", "induction-2l", "--head", "L0H0", "--sink", 0, "--samples", 2)
    assert code == 2 and "--sink" in err and "no learned sink" in err, err


def test_a_retrain_on_text_moves_the_sinks_and_biases_and_exports_back(oss, tmp_path, monkeypatch):
    from attn_core.hf import load_hf
    from attn_core.hf.family_export import export_family, hf_origin
    from attn_core.retraining.job import TrainingJob
    from attn_core.sources import resolve
    from attn_core.training.config import JobConfig

    root, text = oss
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    job = TrainingJob.open(JobConfig(source=str(root), text=str(text), block=12, steps=3, lr=1e-2, batch_size=4))
    res = job.run()
    assert res["status"] == "completed", res["message"]
    before, after = load_hf(root).model.state_dict(), resolve(f"run:{res['run_id']}")
    now = after.model.state_dict()
    for name in ("blocks.0.attn.sinks", "blocks.1.mlp.b_router", "blocks.0.attn.b_O"):
        assert not torch.equal(before[name], now[name]), name
    assert any(not torch.equal(before[k], now[k]) for k in now if ".experts." in k and ".b_" in k)
    out = tmp_path / "exported"
    export_family(after, out, hf_origin(after))
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = after.model(tokens)
        assert float((back(tokens).logits - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))


def _dense_rows(model, tokens, layer: int, kind: str, k: int = 2):
    """Every row's penalty of ``layer`` from the float64 softmax of the model's own scores with the
    sink logit as a last column every query sees, [b, h, T], and the rows that count (>= 2 keys)."""
    from attn_core import metrics

    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, act_name("attn_scores", layer))
    S = cache[act_name("attn_scores", layer)].double()
    b, h, T, _ = S.shape
    mask = model.mask(T, model.cfg.window(layer)).expand(b, h, T, T)
    z = model.blocks[layer].attn.sinks.detach().double().view(1, h, 1, 1).expand(b, h, T, 1)
    p = torch.softmax(torch.cat([S.masked_fill(~mask, -torch.inf), z], -1), -1)
    full = torch.cat([mask, torch.ones(b, h, T, 1, dtype=torch.bool)], -1)
    value = {
        "entropy": lambda: metrics.normalized_entropy(p, full),
        "hoyer": lambda: 1 - metrics.hoyer(p, full),
        "topk": lambda: 1 - metrics.topk_mass(p, k, full),
        "sink": lambda: p[..., -1] + p[..., 0],
    }[kind]()
    return value, mask.sum(-1) >= 2


@pytest.mark.parametrize("path", ["auto", "blocked"])
def test_the_row_penalties_include_the_sink_as_a_dense_float64_softmax_does(oss, path):
    """Every data-view row penalty of a gpt-oss model (a sliding layer and a full one), from the
    cached Q and K through the row engine with the form's sink logits, is the mean over the rows
    that count of the dense float64 softmax with the sink as one more outcome; its gradient
    reaches the sink logits."""
    from attn_core.hf import load_hf
    from attn_core.regularizers import build_penalty

    root, _ = oss
    model = load_hf(root).model.double()
    tokens = torch.randint(1, 100, (2, 14), generator=torch.Generator().manual_seed(5))
    specs = {"entropy": 1.0, "hoyer": 1.0, "topk:2": 1.0, "sink": 1.0}
    penalty = build_penalty(specs, model, path=path)
    cache = penalty.cache()
    model(tokens, cache=cache)
    terms = penalty(model, None, cache)
    for label, kind in (("entropy", "entropy"), ("hoyer", "hoyer"), ("topk:2", "topk"), ("sink", "sink")):
        want = []
        for layer in range(2):
            value, rows = _dense_rows(model, tokens, layer, kind)
            want.append((value * rows).sum((0, 2)) / rows.sum((0, 2)))
        got = terms[next(t for t in terms if t.startswith(label.split(":")[0]))]
        assert float(got.detach()) == pytest.approx(float(torch.cat(want).mean()), rel=1e-9, abs=1e-12), (label, path)
    terms[next(iter(terms))].backward()
    assert float(model.blocks[0].attn.sinks.grad.abs().max()) > 0


def test_the_blocked_long_rows_include_the_sink(oss):
    """``scores --topk`` rows (blocked, never T x T) of a gpt-oss head: each row's learned share,
    token 0's weight and its entropy over the keys and the sink are the dense float64 softmax's."""
    from attn_core.bilinear.blocked import layer_qk, row_stats
    from attn_core.hf import load_hf

    root, _ = oss
    model = load_hf(root).model.double()
    ids = torch.randint(1, 100, (30,), generator=torch.Generator().manual_seed(6)).tolist()
    for layer in range(2):
        stats = row_stats(layer_qk(model, ids, layer), 1)
        p_entropy, _ = _dense_rows(model, torch.tensor([ids]), layer, "entropy")
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([ids]), act_name("pattern", layer))
        A = cache[act_name("pattern", layer)][0, 1].double()
        assert torch.allclose(stats.learned.double(), 1 - A.sum(-1), atol=1e-6), layer
        assert torch.allclose(stats.sink.double(), A[:, 0], atol=1e-6), layer
        n = (model.mask(30, model.cfg.window(layer)).sum(-1) + 1).double()
        assert torch.allclose(stats.entropy.double(), p_entropy[0, 1] * n.log(), atol=1e-5), layer


def test_a_vocabulary_penalty_on_a_model_with_sinks_is_refused_in_one_sentence(oss, tmp_path, monkeypatch):
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    root, text = oss
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    cfg = JobConfig(source=str(root), text=str(text), block=12, steps=2, regularizers={"vocab_entropy": 0.1})
    with pytest.raises(ValueError, match="vocab_entropy.*learned sink"):
        TrainingJob.open(cfg)


def test_the_heatmaps_parts_show_the_bias_terms_and_the_sink_share(oss):
    from attn_core.bilinear import score_parts
    from attn_core.figures.score_parts import sink_share_plot, terms_plot
    from attn_core.hf import load_hf
    from attn_core.hooks import act_name

    root, _ = oss
    loaded = load_hf(root)
    ids = list(range(1, 13))
    parts = score_parts(loaded, ids, 1, 3)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    A = cache[act_name("pattern", 1)][0, 3]
    assert torch.allclose(parts.sink_share + A.sum(-1), torch.ones(12), atol=1e-6)
    assert torch.allclose(parts.token0_share, A[:, 0])
    shares = parts.term_shares()
    assert set(shares) == {"xx", "xb", "bx", "bb"} and sum(shares.values()) == pytest.approx(1.0)
    assert 0.0 < parts.bias_share < 1.0
    assert terms_plot(parts).meta["bias_share"] == pytest.approx(parts.bias_share)
    assert sink_share_plot(parts).data["learned_sink"].tolist() == pytest.approx(parts.sink_share.tolist())


def test_the_spectrum_reports_each_heads_sink_logit_and_share(oss, capsys):
    root, text = oss
    code, out, err = run(capsys, "spectrum", root, "--text", text, "--samples", 2, "--length", 16, "--json")
    assert code == 0, err
    rows = json.loads(out)
    rows = rows["heads"] if isinstance(rows, dict) else rows
    z = load_file(root / "model.safetensors")["model.layers.1.self_attn.sinks"]
    row = next(r for r in rows if (r["layer"], r["head"]) == (1, 2))
    assert row["sink_logit"] == pytest.approx(float(z[2]))
    assert 0.0 < row["sink_share"] < 1.0


def test_scores_topk_prints_each_rows_learned_sink(oss, capsys):
    root, text = oss
    args = ["scores", root, "--layer", 1, "--head", 0, "--text", text, "--length", 40, "--topk", 3]
    code, out, err = run(capsys, *args)
    assert code == 0 and "learned_sink" in out and "learned sink" in out.splitlines()[-1], err
    code, out, err = run(capsys, *args, "--json")
    rows = json.loads(out)["queries"]
    assert all(0.0 < q["learned_sink"] < 1.0 for q in rows)

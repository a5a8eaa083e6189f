"""The Python front door obeys the CLI's rules: every argument of every public ``al.*`` function
(and of the methods a user calls on what they return) walked through a table of hostile values
(wrong types, bools posing as numbers, NaN, infinities, huge numbers, negative and out-of-range
indices, huge strings, numpy arrays, None) is refused before any work with a ValueError,
TypeError, KeyError or IndexError of one line that names the argument, never an internal error;
every write (``Plot.save``, ``EditResult.save``, ``retrain(save=...)``) goes through the output
rule of the CLI, and a run store in a model folder or the shipped assets/ is refused before
anything is created or trained."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import attn_core as al
from attn_core import api, api_surgery, checkpoint, destinations
from attn_core.figures import Plot
from attn_core.zoo import ZOO_DIR
from tests.conftest import make_tiny_model
from tests.refusals import refuses

# the hostile values every argument is walked through (an argument leaves out those it takes)
HOSTILE = {
    "None": None,
    "True": True,
    "float": 1.5,
    "nan": math.nan,
    "inf": math.inf,
    "negative": -1,
    "huge": 10**400,
    "long-str": "a" * 5000,
    "array": np.array([0, 1]),
    "list": [1, 2],
    "object": object(),
}


def values(*leave_out: str, more: dict | None = None) -> list:
    """pytest params: the hostile values less ``leave_out`` (what the argument takes), plus ``more``."""
    table = {k: v for k, v in HOSTILE.items() if k not in leave_out} | (more or {})
    return list(table.items())


@pytest.fixture(scope="module")
def m():
    return al.load("induction-2l")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return checkpoint.save(make_tiny_model(), tmp_path_factory.mktemp("models") / "m")


# --- the table walk ---------------------------------------------------------------------------------

MODEL_ARG = values(
    more={
        "missing-file": "/nonexistent/model/folder",
        "empty": "",
        "nul": "a\x00b",
        "long-run": "run:" + "a" * 5000,
        "long-upload": "upload: " + "a" * 5000,
        "no-run": "run:nope",
    }
)

DEVICES = {"nonsense": "nonsense", "no-such-gpu": "cuda:99", "meta": "meta"}

# function -> {argument: hostile values}; the other arguments keep the base call's values
WALK = {
    "load": ({"source": "induction-2l"}, {"source": MODEL_ARG, "device": values("None", more=DEVICES)}),
    "spectrum": (
        {"samples": 2},
        {
            "model": MODEL_ARG,
            "augmented": values("True"),
            "text": values("None"),
            "samples": values(more={"zero": 0, "str": "4"}),
            "length": values("None", more={"zero": 0}),
            "seed": values(more={"too-big": 2**64}),
            "variance": values(more={"zero": 0}),
        },
    ),
    "sinks": (
        {"samples": 2},
        {
            "model": MODEL_ARG,
            "text": values("None"),
            "eps": values(more={"zero": 0}),
            "samples": values(),
            "length": values("None"),
            "seed": values(),
        },
    ),
    "heads": (
        {"samples": 2},
        {"model": MODEL_ARG, "samples": values(), "seed": values(), "length": values("None"), "rows": values()},
    ),
    "circuits": ({"samples": 2}, {"model": MODEL_ARG, "samples": values(more={"zero": 0}), "seed": values()}),
    "long_view": (
        {"text_or_tokens": [1, 2, 3, 4, 5, 6] * 3, "layer": 1},
        {
            "model": MODEL_ARG,
            "layer": values(more={"too-big": 2}),
            "head": values(more={"too-big": 9}),
            "query": values("negative", more={"too-big": 18, "too-small": -19}),  # -1: the last query
            "window": values("huge", more={"zero": 0}),  # a window or k past the input is the whole input
            "k": values("huge", more={"zero": 0}),
        },
    ),
    "view": (
        {},
        {
            "model": MODEL_ARG,
            "text_or_tokens": values(
                "None",
                "array",
                "list",
                more={
                    "float-tokens": [1.5, 2],
                    "bool-tokens": [True, False],
                    "nan-tokens": [math.nan],
                    "huge-tokens": [10**400],
                    "negative-tokens": [-1, 2],
                    "object-tokens": [object()],
                    "empty": [],
                    "2d-array": np.array([[0, 1]]),
                    "float-array": np.array([0.5, 1.0]),
                },
            ),
            "layer": values(more={"too-big": 2}),
            "heads": values("None", "array", "list", more={"out-of-range": [0, 9], "float-list": [0.5]}),
        },
    ),
    "retrain": (
        {"steps": 1, "progress": False},
        {
            "model": MODEL_ARG,
            "reg": values(
                "None",
                more={
                    "huge-weight": {"sink": 10**400},
                    "nan-weight": {"entropy": math.nan},
                    "bool-weight": {"entropy": True},
                    "bool-key": {True: 1.0},
                    "unknown": {"nonsense": 0.1},
                },
            ),
            "steps": values(more={"zero": 0}),
            "text": values("None"),
            "save": values("True", more={"number": 3}),
            "progress": values("True"),
            "lr": values("float", more={"zero": 0}),
            "seed": values(),
            "heads": values("None", more={"no-head": "L9H9"}),
            "train": values(more={"unknown": "mlp"}),
            "device": values("None", more=DEVICES),
            "precision": values(more={"unknown": "fp8"}),
            "checkpoint_every": values("None", "huge"),  # a huge interval is valid: no checkpoint after step 0
        },
    ),
    "edit": (
        {"head": "L1H0", "rank": 1, "samples": 2},
        {
            "model": MODEL_ARG,
            "head": values(
                more={
                    "bool-pair": (True, 0),
                    "float-pair": (0.5, 0),
                    "triple": (0, 0, 0),
                    "tuples": [(0, 0)],
                    "out-of-range": (5, 0),
                    "name": "L9H9",
                }
            ),
            "rank": values("None", more={"zero": 0, "too-big": 99}),
            "drop": values("array", "list", more={"out-of-range": (99,), "bool": (True,), "str": "0"}),
            "scale": values(
                "None",
                more={
                    "tuples": [(0, 2)],
                    "nan": {0: math.nan},
                    "huge": {0: 10**400},
                    "bool-key": {True: 2.0},
                    "str-key": {"0": 2.0},
                    "out-of-range": {99: 2.0},
                },
            ),
            "ablate": values("None", more={"unknown": "half"}),
            "source": values("None"),
            "source_head": values("None", more={"without-source": "L0H0"}),
            "with_ov": values(more={"without-source": True}),
            "text": values("None"),
            "samples": values(more={"zero": 0}),
            "length": values("None", more={"zero": 0}),
            "seed": values(),
        },
    ),
    "diff": (
        {},
        {
            "a": MODEL_ARG,
            "b": MODEL_ARG,
            "layers": values(
                "None", "array", more={"out-of-range": [5], "float-list": [0.5], "bool-list": [True], "empty": []}
            ),
        },
    ),
}
MODEL_NAMES = ("model", "run", "upload")  # "no run 'x' in <store>" names what the argument named
NAMES = {  # what a refusal may call the argument besides its own name
    "model": MODEL_NAMES,
    "source": ("source", *MODEL_NAMES),
    "a": ("a", *MODEL_NAMES),
    "b": ("b", *MODEL_NAMES),
    "text_or_tokens": ("text_or_tokens", "token"),
    "reg": ("reg", "regularizer", "strength (lambda)"),
    "head": ("head", "layer"),  # the edit's own check (surgery) says which of the two is out of range
    "heads": ("heads", "head", "layer"),
    "drop": ("drop", "mode index"),  # the edit's own range check names the mode index drop holds
    "scale": ("scale", "mode index"),
    "save": ("save", "run store"),
    "checkpoint_every": ("checkpoint_every", "checkpoint-every"),  # the setting's CLI spelling
}
CASES = [
    pytest.param(fn, arg, value, id=f"{fn}-{arg}-{label}")
    for fn, (_, table) in WALK.items()
    for arg, hostile in table.items()
    for label, value in hostile
]


def _call(fn: str, m, **kwargs):
    base, _ = WALK[fn]
    kwargs = {**base, **kwargs}
    if fn == "load":
        return al.load(**kwargs)
    if fn == "diff":
        return al.diff(kwargs.pop("a", m), kwargs.pop("b", m), **kwargs)
    return getattr(al, fn)(kwargs.pop("model", m), **kwargs)


@pytest.mark.parametrize("fn, arg, value", CASES)
def test_every_hostile_argument_is_refused_in_one_line_naming_it(m, fn, arg, value):
    refuses(lambda: _call(fn, m, **{arg: value}), arg, *NAMES.get(arg, ()))


def test_the_walk_covers_every_public_function():
    public = set(api.__all__) | set(api_surgery.__all__)
    classes = {"Model", "HeadView", "Retrained", "EditResult"}  # walked below, through their methods
    assert public - classes - set(WALK) <= {"dynamics"}  # dynamics: test_dynamics_arguments (it needs a series)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    for step in (0, 1):
        checkpoint.save(make_tiny_model(seed=step), root / f"step{step}", {"task": "reverse"})
    return root


DYNAMICS = {
    "source": values("long-str", "list"),
    "samples": values(),
    "seed": values(),
    "detector_samples": values(more={"zero": 0}),
    "cache": values("True"),
    "length": values("None"),
    "text": values("None"),
    "early": values("None", "array", "list", more={"triple": (1, 2, 3), "backwards": (5, 2)}),
    "late": values("None", more={"floats": (1.5, 2.5)}),
}


@pytest.mark.parametrize(
    "arg, value", [pytest.param(a, v, id=f"{a}-{k}") for a, table in DYNAMICS.items() for k, v in table]
)
def test_dynamics_arguments(series, arg, value):
    kwargs = {"source": series, "samples": 2, "detector_samples": 2, arg: value}
    refuses(lambda: al.dynamics(**kwargs), arg, *({"source": ("source", "series", "model")}.get(arg, ())))


@pytest.mark.parametrize("label, value", values(), ids=[k for k, _ in values()])
def test_model_of_refuses_what_is_no_model(label, value):
    refuses(lambda: al.Model.of(value), "model")


PLOT = {"head": values(more={"too-big": 4}), "value": values(more={"unknown": "logits"})}
PLOT["query"] = values("None", more={"too-big": 99})


@pytest.mark.parametrize(
    "arg, value", [pytest.param(a, v, id=f"{a}-{k}") for a, table in PLOT.items() for k, v in table]
)
def test_a_views_plot_refuses_bad_arguments(m, arg, value):
    v = al.view(m, layer=1)
    refuses(lambda: v.plot(**{arg: value}), arg)


@pytest.mark.parametrize(
    "label, head", values("None", more={"too-big": 4}), ids=[k for k, _ in values("None")] + ["too-big"]
)
def test_a_views_table_refuses_what_is_no_head_of_it(m, label, head):
    """``v.frame(True)`` gave head 1's table: a bool is no head."""
    refuses(lambda: al.view(m, layer=1).frame(head), "head")


@pytest.mark.parametrize("kind", ["QK", "OV"])
@pytest.mark.parametrize(
    "index",
    [(0, [1, 2]), (0, (1, 2)), (0, range(2)), (0, np.array([1, 2])), (0, None), (0, True), (0, 1.5), (0, 4), (0, -1)]
    + [(True, 0), (1.5, 0), (2, 0), (None, 0), (0, 0, 0), 0, "L0H0"],
    ids=lambda i: str(i).replace(" ", ""),
)
def test_a_head_index_that_is_not_one_head_is_refused(m, kind, index):
    """``m.QK[0, [1, 2]]`` gave head 1 in silence; a selection is refused, never one head of it."""
    refuses(lambda: getattr(m, kind)[index], "head", "layer")


def test_one_head_still_indexes_with_numpy_integers(m):
    assert torch.equal(m.QK[np.int64(1), np.int64(0)].B, m.QK[1, 0].B)


# --- writes go through the output rule ----------------------------------------------------------------


@pytest.fixture
def shipped_untouched(monkeypatch):
    monkeypatch.delenv(destinations.WRITE_ZOO, raising=False)
    before = sorted(str(p) for p in ZOO_DIR.rglob("*"))
    yield
    assert sorted(str(p) for p in ZOO_DIR.rglob("*")) == before


def _plot(m) -> Plot:
    return al.view(m, layer=1).plot(head=0)


def test_plot_save_never_writes_into_the_shipped_assets(m, shipped_untouched):
    refuses(lambda: _plot(m).save(ZOO_DIR / "fig.csv"), "path")
    refuses(lambda: _plot(m).save(ZOO_DIR.parent / "fig.csv"), "path")


def test_plot_save_never_writes_into_a_model_folder(m, model_folder, tmp_path):
    msg = refuses(lambda: _plot(m).save(model_folder / "fig.csv"), "path")
    assert "inside the model folder" in msg and not (model_folder / "fig.csv").exists()
    (tmp_path / "link").symlink_to(model_folder)
    refuses(lambda: _plot(m).save(tmp_path / "link" / "fig.csv"), "path")
    assert not (model_folder / "fig.csv").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_plot_save_never_replaces_a_link(m, tmp_path, overwrite):
    (tmp_path / "fig.csv").symlink_to(tmp_path / "nowhere.csv")
    msg = refuses(lambda: _plot(m).save(tmp_path / "fig.csv", overwrite=overwrite), "path")
    assert "dangling link" in msg
    assert (tmp_path / "fig.csv").is_symlink() and not (tmp_path / "nowhere.csv").exists()


def test_plot_save_replaces_a_file_only_when_asked(m, tmp_path):
    out = _plot(m).save(tmp_path / "fig.csv")
    refuses(lambda: _plot(m).save(out), "path")
    out.write_text("old")
    assert _plot(m).save(out, overwrite=True) == out and out.read_text() != "old"


@pytest.mark.parametrize(
    "kwargs",
    [{"path": None}, {"path": 3}, {"path": "a" * 5000 + ".csv"}, {"path": "x.txt"}, {"path": "x.csv", "fmt": 3}]
    + [{"path": "x.csv", "fmt": "gif"}, {"path": "x.csv", "overwrite": "no"}, {"path": "x.csv", "overwrite": 1}],
    ids=lambda kw: "-".join(f"{k}={str(v)[:12]}" for k, v in kw.items()),
)
def test_plot_save_refuses_bad_arguments(m, tmp_path, monkeypatch, kwargs):
    monkeypatch.chdir(tmp_path)
    refuses(lambda: _plot(m).save(**kwargs), *kwargs)
    assert list(tmp_path.iterdir()) == []


def test_edit_save_follows_the_rule_too(m, model_folder, shipped_untouched):
    r = al.edit(m, "L1H0", rank=16, samples=2)
    refuses(lambda: r.save(model_folder / "edited"), "--out", "out")
    refuses(lambda: r.save(ZOO_DIR / "edited"), "--out", "out")
    refuses(lambda: r.save(None), "out")


# --- a run store in a model folder or the shipped assets/ -----------------------------------------------


def _no_store_files(folder: Path) -> bool:
    return not any(p.name.startswith("index.sqlite") for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["itself", "inside"])
def test_retrain_refuses_a_store_in_a_model_folder_before_training(model_folder, where, monkeypatch):
    import attn_core.retraining.job as job

    def never(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr(job.TrainingJob, "run", never)
    store = model_folder if where == "itself" else model_folder / "runs"
    msg = refuses(lambda: al.retrain("induction-2l", steps=2, save=store, progress=False), "run store")
    assert "model folder" in msg and _no_store_files(model_folder) and not (model_folder / "runs").exists()


def test_retrain_refuses_a_store_in_the_shipped_assets(shipped_untouched):
    refuses(lambda: al.retrain("induction-2l", steps=2, save=ZOO_DIR / "runs", progress=False), "run store")


def test_the_cli_refuses_a_store_in_a_model_folder_before_training(model_folder, monkeypatch):
    from tests.conftest import cli_run

    monkeypatch.setenv("ATTN_LAB_RUNS", str(model_folder))
    res = cli_run("retrain", "induction-2l", "--steps", "2", "--json")
    assert res.exit_code == 2 and "is the model folder" in res.stderr.strip().splitlines()[-1], res.output
    assert _no_store_files(model_folder)


def test_a_saved_comparison_follows_the_rule_too(model_folder, tmp_path):
    from attn_core import qk

    result = qk.Comparison(qk.CompareConfig(), runs=[])
    refuses(lambda: result.save(model_folder / "c.json"), "path")
    (tmp_path / "c.json").symlink_to(tmp_path / "nowhere.json")
    refuses(lambda: result.save(tmp_path / "c.json"), "path")
    assert not (model_folder / "c.json").exists() and not (tmp_path / "nowhere.json").exists()
    assert result.save(tmp_path / "d.json").is_file()
    refuses(lambda: result.save(tmp_path / "d.json"), "path")  # an existing file is kept unless asked
    assert result.save(tmp_path / "d.json", overwrite=True).is_file()
    refuses(lambda: result.save(tmp_path / "e.json", overwrite="yes"), "overwrite")


def test_numpy_values_a_user_passes_are_taken(m):
    """What is refused is what is wrong: numpy integers and 1-d integer arrays are indices."""
    assert len(al.diff(m, m, layers=np.array([0, 1]))) == 8
    v = al.view(m, np.array([1, 2, 3]), layer=np.int64(1), heads=np.array([0, 2]))
    assert v.token_ids == [1, 2, 3] and v.heads == [0, 2]
    assert v.plot(head=np.int64(2), query=np.int64(2)).name == "sequence_scores_L1H2"
    e = al.edit(m, (np.int64(1), np.int64(0)), scale={np.int64(0): np.float64(2.0)}, samples=2, seed=np.int64(0))
    assert e.edits[0].scale == ((0, 2.0),)


def test_a_transplant_still_takes_its_source_head(m):
    e = al.edit(m, "L1H0", source="induction-2l", source_head="L1H1", with_ov=True, samples=2)
    assert e.edits[0].source_head == (1, 1) and e.edits[0].with_ov

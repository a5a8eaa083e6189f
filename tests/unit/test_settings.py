"""One declaration per retrain setting (attn_core.training.settings): the retrain and sweep options
are built from JobConfig's declarations (flag, default, help), the reproduce line parses back, by
the retrain command's own parser, into the settings it came from, and the declared bounds are
what the checks accept."""

from __future__ import annotations

import dataclasses
import shlex

import pytest
import typer

from attn_core.cli import runs, sweep
from attn_core.declarations import declared
from attn_core.training.config import JobConfig

DECLARED = [f.name for f in dataclasses.fields(JobConfig) if f.metadata.get("flag")]


def _command(app, name: str):
    cmd = typer.main.get_command(app)
    return cmd.commands[name] if hasattr(cmd, "commands") else cmd


def _params(app, name: str) -> dict:
    return {p.name: p for p in _command(app, name).params}


@pytest.mark.parametrize("name", [n for n in DECLARED if n not in ("workers", "gpus_per_worker", "strategy")])
def test_the_retrain_option_is_the_declaration(name):
    param = _params(runs.app, "retrain")[name]
    meta = declared(JobConfig, name)
    assert param.opts[0] == meta["flag"].split("/")[0]
    assert param.default == JobConfig.__dataclass_fields__[name].default
    assert param.help == meta["help"]


def test_the_sweep_shares_the_declarations():
    shared = set(_params(sweep.app, "sweep")) & set(DECLARED)
    assert {"steps", "lr", "penalty_rows", "kl", "block", "checkpoint_log"} <= shared
    for name in shared - {"heads", "text", "gpus_per_worker", "strategy"}:  # the sweep's own wording or option
        assert _params(sweep.app, "sweep")[name].help == declared(JobConfig, name)["help"], name


CASES = [
    dict(),
    dict(heads="L0", entmax_alpha=1.5, steps=50, seed=3, lr=3e-4, batch_size=5, device="cpu", precision="bf16"),
    dict(sync_every=7, compile=True, checkpoint_log=3, checkpoint_params="attn", checkpoint_steps=[1, 2]),
    dict(checkpoint_every=4, checkpoint_max_mb=12.5, text="my text.txt", text_field="body", eval_text="e.txt"),
    dict(text="t.txt", block=64, train="qk", kl=0.5, penalty_rows=4, workers=2, gpus_per_worker=1),
]


@pytest.mark.parametrize("settings", CASES)
def test_the_reproduce_line_parses_back_into_its_settings(settings):
    cfg = JobConfig("induction-2l", ["entropy=0.1"], **settings)
    args = shlex.split(cfg.command())
    assert args[:3] == ["attn-lab", "retrain", "induction-2l"]
    params = _command(runs.app, "retrain").make_context("retrain", args[2:]).params  # parsed only: nothing trains
    for name in DECLARED:
        want = getattr(cfg, name)
        got = params[name]
        if name == "checkpoint_steps" and got is not None:
            got = [int(s) for s in got.split(",")]
        assert got == want, name
    assert params["reg"] == ["entropy=0.1"]


def test_the_declared_bounds_are_the_checks():
    for name in ("steps", "penalty_rows", "block", "batch_size", "seed"):
        lo, hi = declared(JobConfig, name)["bounds"]
        text = {"text": "t.txt"} if name == "block" else {}  # --block needs --text
        for good in (lo, hi):
            assert getattr(JobConfig("x", **{name: good}, **text), name) == good
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ValueError, match=name):
                JobConfig("x", **{name: bad}, **text)


def test_train_takes_the_same_precision_and_compile_options():
    from attn_core.cli import models
    from attn_core.training.config import TrainConfig

    train = _params(models.app, "train")
    for name in ("precision", "compile"):
        assert train[name].help == declared(JobConfig, name)["help"]
        assert train[name].default == getattr(TrainConfig(), name)  # the recipe's default is the declaration's


@pytest.mark.parametrize(
    ("module", "command", "config_of"), [("grow", "grow", "GrowConfig"), ("qk", "compare-qk", "CompareConfig")]
)
def test_grow_and_compare_take_their_declared_settings(module, command, config_of):
    import importlib

    app = importlib.import_module(f"attn_core.cli.{module}").app
    config = getattr(importlib.import_module(f"attn_core.{module}"), config_of)
    names = [f.name for f in dataclasses.fields(config) if f.metadata.get("flag")]
    assert {"steps", "lr", "device", "precision"} <= set(names)  # every option of the command is declared
    params = {p.opts[0]: p for p in _command(app, command).params}
    for name in names:
        meta = declared(config, name)
        param = params[meta["flag"]]
        assert param.help == meta["help"], name
        if name not in ("add", "d_qks", "merged_kinds"):  # add is required; the widths and kinds as text
            assert param.default == config.__dataclass_fields__[name].default, name


def test_the_workers_options_are_declared_once():
    for name in ("gpus_per_worker", "strategy"):
        meta = declared(JobConfig, name)
        assert meta["help"] and _params(runs.app, "retrain")[name].help == meta["help"]
        assert _params(sweep.app, "sweep")[name].help == meta["help"]


@pytest.mark.parametrize(
    ("module", "function", "config_path"),
    [
        ("models", "train_cmd", "attn_core.training.config:JobConfig"),
        ("runs", "retrain_cmd", "attn_core.training.config:JobConfig"),
        ("sweep", "sweep_cmd", "attn_core.training.config:JobConfig"),
        ("grow", "grow_cmd", "attn_core.grow:GrowConfig"),
        ("qk", "compare_qk_cmd", "attn_core.qk:CompareConfig"),
    ],
)
def test_no_command_writes_a_declared_option_by_hand(module, function, config_path):
    """Every option of a command that is a declared setting comes from its declaration (the command
    receives it in ``settings``): none is a parameter of the command's own."""
    import importlib
    import inspect

    fn = inspect.unwrap(getattr(importlib.import_module(f"attn_core.cli.{module}"), function))
    where, name = config_path.split(":")
    config = getattr(importlib.import_module(where), name)
    flags = {
        declared(config, n)["flag"].split("/")[0]
        for n in (f.name for f in dataclasses.fields(config) if f.metadata.get("flag"))
    }
    own = {f"--{p.replace('_', '-')}" for p in inspect.signature(fn).parameters} - {"--settings"}
    for p in inspect.signature(fn).parameters.values():
        if isinstance(p.default, typer.models.OptionInfo):
            own |= {d.split("/")[0] for d in p.default.param_decls if d.startswith("--")}
    assert not own & flags, f"{function} writes {sorted(own & flags)} by hand"


def test_compare_qk_lists_are_generated_options():
    from attn_core.cli import qk

    params = _params(qk.app, "compare-qk")
    assert params["d_qks"].opts == ["--d-qk"] and params["d_qks"].default == "1,2,4,16"
    assert params["merged_kinds"].opts == ["--merged"]
    assert params["merged_kinds"].default == "merged,merged + wd,merged + nuclear"


def test_the_settings_every_command_takes_are_declared_once():
    """steps, seed, lr, device, precision and the evaluation: one flag, bounds and format for every command; each
    command's config takes its default and help from the one table, where they differ by command."""
    from pathlib import Path

    from attn_core.grow import GrowConfig
    from attn_core.qk import CompareConfig
    from attn_core.training.config import TrainConfig
    from attn_core.training.settings import SHARED

    configs = {"train": TrainConfig, "retrain": JobConfig, "grow": GrowConfig, "compare": CompareConfig}
    for name, entry in SHARED.items():
        for command, config in configs.items():
            if command not in entry:
                continue
            default, help, *own = entry[command]
            meta = declared(config, name)
            own = own[0] if own else {}
            assert (meta["flag"], meta["help"]) == (own.get("flag", entry["flag"]), help), (name, command)
            assert meta["bounds"] == own.get("bounds", entry.get("bounds")), (name, command)
            assert config.__dataclass_fields__[name].default == default, (name, command)
    steps = {command: SHARED["steps"][command][0] for command in configs}
    assert steps == {"train": 2000, "retrain": 300, "grow": 100, "compare": 400}  # said per command, once
    assert {command: SHARED["eval_every"][command][0] for command in configs} == {
        "train": 250,
        "retrain": 100,
        "grow": 10,
        "compare": 25,
    }
    source = Path(__file__).resolve().parents[2] / "attn_core"
    runs = ("training/config.py", "grow/config.py", "qk/config.py", "cli/models.py", "cli/qk.py", "cli/runs.py")
    for entry in (
        e for e in SHARED.values() if e["flag"]
    ):  # the configs of a run and their commands never write the flag again
        written = [p for p in runs if f'"{entry["flag"]}"' in (source / p).read_text()]
        assert not written, f"{entry['flag']} is written in {written}"


def test_the_batch_the_weight_decay_and_the_warmup_are_declared_once():
    """batch_size, weight_decay and warmup_steps stand in the one table beside steps and lr: every config
    reads its field from there (a command's own default as its value), and compare-qk's options are them."""
    from attn_core.cli import qk
    from attn_core.grow import GrowConfig
    from attn_core.qk import CompareConfig
    from attn_core.training.config import TrainConfig
    from attn_core.training.settings import SHARED, shared

    configs = {"train": TrainConfig(), "retrain": JobConfig("x"), "grow": GrowConfig(), "compare": CompareConfig()}
    defaults = {
        "batch_size": {"train": 128, "retrain": None, "grow": 32, "compare": 64},
        "weight_decay": {"train": 0.1, "retrain": None, "grow": 0.0, "compare": 0.1},
        "warmup_steps": {"train": 100, "retrain": None, "grow": 0, "compare": None},
    }
    for name, by_command in defaults.items():
        assert {command: SHARED[name][command][0] for command in by_command} == by_command, name
        for command, config in configs.items():
            assert declared(config, name) == dict(shared(name, command).metadata), (name, command)
            assert getattr(config, name) == by_command[command], (name, command)
    params = _params(qk.app, "compare-qk")
    for name in ("batch_size", "weight_decay"):
        assert params[name].help == SHARED[name]["compare"][1] and params[name].default == defaults[name]["compare"]
    assert _params(runs.app, "retrain")["batch_size"].help == SHARED["batch_size"]["retrain"][1]
    # the recipe a run trains with: grow's fine-tuning without decay or warmup, compare-qk's warmup of its steps
    assert (GrowConfig().train_config().weight_decay, GrowConfig().train_config().warmup_steps) == (0.0, 0)
    assert CompareConfig(steps=400).train_config(0).warmup_steps == 40


def _bounded(config) -> list[str]:
    return [f.name for f in dataclasses.fields(config) if f.metadata.get("bounds")]


@pytest.mark.parametrize("config_of", ["GrowConfig", "CompareConfig"])
def test_grow_and_compare_check_their_declared_bounds(config_of):
    """Every bounded setting of grow and compare-qk is checked by its declaration: both ends are accepted,
    a step beyond either is one ValueError naming the setting (and the non-number, too)."""
    from attn_core import grow, qk

    config = getattr(grow if config_of == "GrowConfig" else qk, config_of)
    base = {} if config is grow.GrowConfig else dict(d_qks=(1,), merged_kinds=())  # no width above d_model=1
    names = _bounded(config)
    some = {"steps", "batch_size", "eval_every"} | ({"seed", "damping"} if config is grow.GrowConfig else {"seeds"})
    assert some <= set(names)
    for name in names:
        lo, hi = declared(config, name)["bounds"]
        for good in (lo, hi):
            assert getattr(config(**base, **{name: good}), name) == good, name
        step = 1 if isinstance(lo, int) and isinstance(hi, int) else 0.5
        for bad in (lo - step, hi + step, "3", float("nan")):
            with pytest.raises(ValueError, match=f"^invalid (growth|comparison) setting: {name} must be ") as e:
                config(**base, **{name: bad})
            assert "\n" not in str(e.value) and f"got {bad!r}"[:12] in str(e.value), name


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["grow", "no-such-model", "--add", "1", "--steps", "0"], "steps must be 1..100,000 (a whole number), got 0"),
        (["grow", "no-such-model", "--add", "1", "--damping", "2"], "damping must be in [0, 1] (a number), got 2.0"),
        (["compare-qk", "--seeds", "0"], "seeds must be 1..64 (a whole number), got 0"),
        (["compare-qk", "--weight-decay", "101"], "weight_decay must be in [0, 100] (a number), got 101.0"),
        (["compare-qk", "--batch-size", "0"], "batch_size must be 1..65536 (a whole number), got 0"),
    ],
)
def test_a_setting_beyond_its_bounds_is_one_line_and_exit_2(args, line):
    """grow and compare-qk refuse a setting outside its declared bounds before anything loads or trains:
    exit 2, one line naming the setting."""
    from typer.testing import CliRunner

    from attn_core.cli import app

    proc = CliRunner().invoke(app, args)
    assert proc.exit_code == 2, proc.output
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: invalid ") and line in proc.stderr

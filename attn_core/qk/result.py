"""The result of a comparison: :class:`Comparison` holds one record per (variant, seed)
run and derives every table, the findings and the Markdown report from them."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attn_core import card
from attn_core.qk.config import CompareConfig
from attn_core.qk.convert import qk_params_per_head
from attn_core.tasks import get_task


@dataclass
class Comparison:
    """The result of :func:`compare`: its settings and one record per (variant, seed) run (see
    :func:`train_variant`). Tables are derived from the records; ``to_dict``/``from_dict`` round-trip
    through JSON, so a saved comparison is shown exactly as it was measured."""

    config: CompareConfig
    runs: list[dict]
    machine: str = field(default_factory=card.machine)
    created: str = field(default_factory=card.now)
    wall_time_s: float = 0.0

    # tables ----------------------------------------------------------------------------------------
    def variant_names(self) -> list[str]:
        return list(dict.fromkeys(r["variant"] for r in self.runs))

    def per_seed(self) -> pd.DataFrame:
        """One row per run: variant, seed, status, params, final_loss, accuracy, ranks, ms_per_step."""
        cols = [
            "variant",
            "kind",
            "seed",
            "status",
            "params",
            "final_loss",
            "accuracy",
            "stable_rank",
            "effective_rank",
            "nuclear_norm",
            "frobenius_norm",
            "ln1_gain",
            "ms_per_step",
            "wall_s",
            "run_id",
        ]
        return pd.DataFrame([{c: r.get(c) for c in cols} for r in self.runs], columns=cols)

    def summary(self, tolerance: float = 0.01) -> list[dict]:
        """One row per variant, means and (sample) standard deviations over seeds:
        name, qk, d_head (the query/key width d_qk; None for merged heads), rank_cap, params,
        params_qk_per_head, final_loss_mean/std, accuracy_mean/std, stable_rank_mean/std,
        effective_rank_mean, stable_rank_by_layer, rank_needed (the least tested rank r whose
        truncation keeps the mean accuracy within ``tolerance``), steps_to_bar (the first evaluation
        step at which the mean held-out accuracy over seeds reaches the task's accuracy bar; None if
        never), ln1_gain_mean, ms_per_step (median over the training steps of every seed), seeds,
        diverged (how many seeds did not complete), run_ids."""
        d = self.config.d_model
        bar = get_task(self.config.task).accuracy_bar
        trunc = self.truncation()
        curves = self.curves()
        out = []
        for name in self.variant_names():
            rs = [r for r in self.runs if r["variant"] == name]
            first = rs[0]
            acc = _mean_std(rs, "accuracy")["accuracy_mean"]
            by_rank = trunc[trunc["variant"] == name].groupby("rank")["accuracy"].mean()
            held = curves[(curves["variant"] == name) & (curves["metric"] == "eval_accuracy")]
            held = held.groupby("step")["value"].mean()
            by_layer = [
                statistics.fmean(h["stable_rank"] for r in rs for h in r["spectrum"] if h["layer"] == l)
                for l in range(self.config.n_layers)
            ]
            steps_ms = [t for r in rs for t in r["step_ms"]]
            out.append(
                {
                    "name": name,
                    "qk": first["qk"],
                    "kind": first["kind"],
                    "d_head": first["d_qk"],
                    "rank_cap": first["d_qk"] if first["qk"] == "factored" else d,
                    "params": first["params"],
                    "params_qk_per_head": qk_params_per_head(d, first["qk"], first["d_qk"]),
                    **_mean_std(rs, "final_loss"),
                    **_mean_std(rs, "accuracy"),
                    **_mean_std(rs, "stable_rank"),
                    "effective_rank_mean": statistics.fmean(r["effective_rank"] for r in rs),
                    "nuclear_norm_mean": statistics.fmean(r["nuclear_norm"] for r in rs),
                    "stable_rank_by_layer": by_layer,
                    "rank_needed": next((int(k) for k, v in by_rank.items() if v >= acc - tolerance), None),
                    "steps_to_bar": next((int(k) for k, v in held.items() if v >= bar), None),
                    "ln1_gain_mean": statistics.fmean(r["ln1_gain"] for r in rs),
                    "ms_per_step": statistics.median(steps_ms) if steps_ms else math.nan,
                    "seeds": len(rs),
                    "diverged": sum(r["status"] != "completed" for r in rs),
                    "run_ids": [r["run_id"] for r in rs if r["run_id"]],
                }
            )
        return out

    def summary_frame(self) -> pd.DataFrame:
        rows = self.summary()
        for r in rows:
            r["stable_rank_by_layer"] = ", ".join(f"{v:.2f}" for v in r["stable_rank_by_layer"])
            r["run_ids"] = ", ".join(r["run_ids"])
        return pd.DataFrame(rows)

    def curves(self) -> pd.DataFrame:
        """Tidy curves: variant, seed, step, metric (loss/accuracy: training-batch means over the
        last eval_every steps; eval_loss/eval_accuracy: held-out), value."""
        rows = [
            {"variant": r["variant"], "seed": r["seed"], "step": c["step"], "metric": k, "value": c[k]}
            for r in self.runs
            for c in r["curves"]
            for k in ("loss", "accuracy", "eval_loss", "eval_accuracy")
        ]
        return pd.DataFrame(rows, columns=["variant", "seed", "step", "metric", "value"])

    def spectra(self) -> pd.DataFrame:
        """Tidy singular values of B: variant, seed, layer, head, index, singular_value,
        normalized (sigma_i / sigma_1)."""
        rows = []
        for r in self.runs:
            for h in r["spectrum"]:
                top = h["singular_values"][0] or 1.0
                rows += [
                    {
                        "variant": r["variant"],
                        "seed": r["seed"],
                        "layer": h["layer"],
                        "head": h["head"],
                        "index": i,
                        "singular_value": s,
                        "normalized": s / top,
                    }
                    for i, s in enumerate(h["singular_values"])
                ]
        return pd.DataFrame(rows, columns=["variant", "seed", "layer", "head", "index", "singular_value", "normalized"])

    def truncation(self) -> pd.DataFrame:
        """variant, seed, rank, loss, accuracy with every B cut to that rank."""
        rows = [{"variant": r["variant"], "seed": r["seed"], **t} for r in self.runs for t in r["truncation"]]
        return pd.DataFrame(rows, columns=["variant", "seed", "rank", "loss", "accuracy"])

    # what the numbers say ------------------------------------------------------------------------------
    def findings(self, tolerance: float = 0.01) -> list[str]:
        """Sentences read off the measured numbers (nothing here is fixed in advance): which
        variants reach the best accuracy and how fast, what the rank cap costs, the rank the heads
        learn (stable rank) and need (truncation), and what weight decay and the nuclear penalty do
        to it. ``tolerance``: how far below the best accuracy still counts as reaching it."""
        rows = {r["name"]: r for r in self.summary(tolerance)}
        if not rows:
            return []
        bar = get_task(self.config.task).accuracy_bar
        best = max(r["accuracy_mean"] for r in rows.values())
        out = [
            f"Best held-out accuracy {best:.3f} after {self.config.steps} steps; within {tolerance:.0%} of it: "
            + ", ".join(n for n, r in rows.items() if r["accuracy_mean"] >= best - tolerance)
            + "."
        ]
        speed = [
            f"{n} {r['steps_to_bar']}" if r["steps_to_bar"] is not None else f"{n} never"
            for n, r in sorted(rows.items(), key=lambda kv: kv[1]["steps_to_bar"] or math.inf)
        ]
        out.append(
            f"Steps until the mean held-out accuracy reaches the task's bar {bar:.0%}: " + ", ".join(speed) + "."
        )
        if best < bar:
            out.append(
                f"No variant reached the task's bar {bar:.0%} in {self.config.steps} steps, so the runs say "
                "nothing yet about the rank the task needs: train longer."
            )
            return out
        factored = sorted((r for r in rows.values() if r["qk"] == "factored"), key=lambda r: r["d_head"])
        short = [r for r in factored if r["accuracy_mean"] < best - tolerance]
        if short:
            out.append(
                "The rank cap costs accuracy: "
                + ", ".join(
                    f"d_qk={r['d_head']} reaches {r['accuracy_mean']:.3f} ± {r['accuracy_std']:.3f}" for r in short
                )
                + f" (best {best:.3f})."
            )
        elif factored:
            out.append(
                f"Every factored width down to d_qk={factored[0]['d_head']} reaches the best accuracy: "
                "this task does not need a high-rank B."
            )
        for name, r in rows.items():
            need = (
                f"cutting every B to rank {r['rank_needed']} keeps the accuracy within {tolerance:.0%}"
                if r["rank_needed"] is not None
                else "no tested rank cut keeps the accuracy"
            )
            out.append(
                f"{name}: stable rank of B {r['stable_rank_mean']:.2f} ± {r['stable_rank_std']:.2f} (by layer "
                f"{', '.join(f'{v:.2f}' for v in r['stable_rank_by_layer'])}) with a cap of {r['rank_cap']}; {need}."
            )
        plain = rows.get("merged")
        for name in ("merged + wd", "merged + nuclear"):
            if plain and name in rows:
                r = rows[name]
                out.append(
                    f"{name} vs merged: stable rank {r['stable_rank_mean']:.2f} vs {plain['stable_rank_mean']:.2f}, "
                    f"nuclear norm of B {r['nuclear_norm_mean']:.3g} vs {plain['nuclear_norm_mean']:.3g}, "
                    f"LayerNorm gain |w| {r['ln1_gain_mean']:.2f} vs {plain['ln1_gain_mean']:.2f}, "
                    f"accuracy {r['accuracy_mean']:.3f} vs {plain['accuracy_mean']:.3f}."
                )
        return out

    # persistence ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "runs": self.runs,
            "machine": self.machine,
            "created": self.created,
            "wall_time_s": self.wall_time_s,
            "variants": self.summary(),
            "command": self.config.command(),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> Comparison:
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("runs"), list)
            or not isinstance(raw.get("config"), dict)
        ):
            raise ValueError("not a saved comparison: expected a JSON object with 'config' and 'runs'")
        try:
            return cls(
                CompareConfig.from_dict(raw["config"]),
                raw["runs"],
                raw.get("machine", ""),
                raw.get("created", ""),
                float(raw.get("wall_time_s", 0.0)),
            )
        except TypeError as e:
            raise ValueError(f"not a saved comparison: {e}") from None

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the comparison as JSON, atomically (a temporary sibling renamed into place,
        removed if anything fails); an existing file is replaced only with ``overwrite``, a folder
        is refused, and the output rule of every write holds (``destinations.check_destination``:
        never inside a model folder or the shipped assets/, never through a link)."""
        from attn_core.destinations import check_destination, check_path

        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {type(overwrite).__name__}")
        path = check_path(path, "path")
        if not path.is_dir():
            check_destination(path, "path", overwrite=overwrite)
        if path.is_dir():
            raise ValueError(f"{path} is a folder; give the path of a .json file to write")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(_finite(self.to_dict()), indent=1) + "\n")
            os.chmod(name, 0o644)  # mkstemp makes it private; a result is readable like any file
            os.replace(name, path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> Comparison:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no saved comparison at {path}; run experiments/merged_vs_factored.py to make one")
        try:
            raw = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(raw)

    def markdown(self) -> str:
        """The summary table and findings as Markdown (the experiment's .md report)."""
        c = self.config
        lines = [
            f"# Merged vs factored QK on `{c.task}`",
            "",
            f"{c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}, d_head (V/O) {c.d_head}, no MLP; "
            f"{c.steps} steps, batch {c.batch_size}, lr {c.lr:g}, weight decay {c.weight_decay:g} on every matrix "
            f"(W_Q, W_K included; W_QK: 0, or {c.qk_weight_decay:g} for merged + wd), nuclear penalty "
            f"lambda {c.nuclear:g} for merged + nuclear; seeds {c.seed_list}; final metrics on {c.measure_samples} "
            f"held-out sequences (seed {c.eval_seed}).",
            "",
            f"Machine: {self.machine}; created {self.created}; total wall time {self.wall_time_s:.0f} s.",
            "",
            f"Reproduce: `{c.command()}`",
            "",
            "| variant | rank cap | params (QK/head) | params (model) | final loss | accuracy | stable rank of B "
            "| stable rank by layer | ms/step |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.summary():
            lines.append(
                f"| {r['name']} | {r['rank_cap']} | {r['params_qk_per_head']} | {r['params']} "
                f"| {r['final_loss_mean']:.4f} ± {r['final_loss_std']:.4f} | {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} "
                f"| {r['stable_rank_mean']:.2f} ± {r['stable_rank_std']:.2f} "
                f"| {', '.join(f'{v:.2f}' for v in r['stable_rank_by_layer'])} | {r['ms_per_step']:.2f} |"
            )
        lines += [
            "",
            "Mean ± sample standard deviation over seeds; ms/step is the median over every training step "
            "(held-out evaluations excluded) of every seed, in one process.",
            "",
        ]
        trunc = self.truncation()
        if len(trunc):
            table = trunc.groupby(["variant", "rank"], sort=False)["accuracy"].mean().unstack("rank")
            ranks = list(table.columns)
            lines += [
                "Accuracy with every B cut to rank r (mean over seeds):",
                "",
                "| variant | " + " | ".join(f"r={k}" for k in ranks) + " |",
                "|---|" + "---|" * len(ranks),
            ]
            for name, row in table.iterrows():
                lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
            lines.append("")
        lines += ["## What the numbers say", ""] + [f"- {s}" for s in self.findings()]
        return "\n".join(lines) + "\n"


def _mean_std(rs: list[dict], key: str) -> dict:
    vals = [r[key] for r in rs if r[key] is not None and math.isfinite(r[key])]
    mean = statistics.fmean(vals) if vals else math.nan
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {f"{key}_mean": mean, f"{key}_std": std}


def _finite(obj):
    """JSON has no NaN: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj

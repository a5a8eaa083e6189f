"""``compare-qk``: merged vs factored QK, trained side by side on the same data."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, emit, guarded, table
from attn_core.qk import CompareConfig
from attn_core.validate import default

app = typer.Typer()

_QK_COLS = [
    "name",
    "rank_cap",
    "params",
    "final_loss_mean",
    "final_loss_std",
    "accuracy_mean",
    "accuracy_std",
    "stable_rank_mean",
    "rank_needed",
    "steps_to_bar",
    "ms_per_step",
]


def _int_list(text: str, what: str) -> tuple:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, e.g. 1,2,4,16; got {text!r}") from None


def _joined(name: str) -> str:
    """A tuple default of CompareConfig as the comma-separated text the option takes."""
    return ",".join(str(v) for v in default(CompareConfig, name))


@app.command("compare-qk")
@guarded
def compare_qk_cmd(
    task: str = typer.Option(
        default(CompareConfig, "task"), help="Task to train on (see `attn-lab presets` for tasks)."
    ),
    steps: int = typer.Option(default(CompareConfig, "steps"), help="Training steps per run."),
    seeds: int = typer.Option(
        default(CompareConfig, "seeds"), help="Seeds per variant (first-seed, first-seed + 1, ...)."
    ),
    first_seed: int = typer.Option(default(CompareConfig, "first_seed"), help="The first seed."),
    d_qk: str = typer.Option(
        _joined("d_qks"),
        "--d-qk",
        help="Query/key widths of the factored variants (comma-separated, each 1..d_model; empty for none).",
    ),
    merged: str = typer.Option(
        _joined("merged_kinds"),
        help="Merged variants, comma-separated: merged, merged + wd, merged + nuclear (or none).",
    ),
    d_model: int = typer.Option(default(CompareConfig, "d_model"), help="Residual width (every variant)."),
    weight_decay: float = typer.Option(
        default(CompareConfig, "weight_decay"),
        help="AdamW weight decay of every matrix but W_QK (W_Q and W_K included).",
    ),
    qk_weight_decay: float = typer.Option(
        default(CompareConfig, "qk_weight_decay"), help="AdamW weight decay of W_QK in 'merged + wd'."
    ),
    nuclear: float = typer.Option(
        default(CompareConfig, "nuclear"), help="lambda of the penalty lambda * mean ||B||_* in 'merged + nuclear'."
    ),
    lr: float = typer.Option(default(CompareConfig, "lr"), help="Peak learning rate."),
    batch_size: int = typer.Option(default(CompareConfig, "batch_size"), help="Sequences per step."),
    device: str = typer.Option(default(CompareConfig, "device"), help="cpu, cuda or auto (ms/step is measured on it)."),
    precision: str = typer.Option(
        default(CompareConfig, "precision"), help="fp32, or bf16 (autocast of the forward and loss; weights stay fp32)."
    ),
    threads: int = typer.Option(
        default(CompareConfig, "threads"),
        help="torch CPU threads while "
        "training (0: torch's default); one is fastest for these small "
        "models on a busy machine.",
    ),
    store: bool = typer.Option(True, "--store/--no-store", help="Save every run in the run store."),
    out: Path | None = typer.Option(
        None, help="Also save the whole comparison as JSON in this new file (the page can show it)."
    ),
    as_json: bool = JsonOpt,
):
    """Train one architecture with factored QK (several d_qk) and merged QK (plain, with
    weight decay, with a nuclear-norm penalty) on the same data and seeds; loss, accuracy, rank of
    B, parameters and time per step per variant. Ctrl-C stops the run under way (kept as
    stopped) and reports the runs made so far (exit status 130)."""
    from attn_core.destinations import check_destination
    from attn_core.qk import compare
    from attn_core.training.interrupt import sigint_stops

    kinds = tuple(k.strip() for k in merged.split(",") if k.strip() and k.strip() != "none")
    cfg = CompareConfig(
        task=task,
        steps=steps,
        seeds=seeds,
        first_seed=first_seed,
        d_qks=_int_list(d_qk, "--d-qk"),
        merged_kinds=kinds,
        d_model=d_model,
        weight_decay=weight_decay,
        qk_weight_decay=qk_weight_decay,
        nuclear=nuclear,
        lr=lr,
        batch_size=batch_size,
        device=device,
        precision=precision,
        threads=threads,
    )
    if out is not None:
        check_destination(out)  # before training: a folder, an existing file or no write access
    from attn_core.progress import Progress

    bar = Progress(100, "compare-qk", unit="")  # on stderr, with --json too (stdout holds the JSON)

    def progress(fraction: float, message: str) -> None:
        bar.set(100 * fraction, message)

    with sigint_stops(exiting=True) as ctrl_c:  # held until the command ends
        result = compare(
            cfg,
            store=None if store else False,
            progress=progress,
            interrupt=ctrl_c.message,
        )
        bar.close()
        if out is not None:
            result.save(out)
        total = len(cfg.seed_list) * len(cfg.variants())
        cut = ctrl_c.is_set() and (len(result.runs) < total or any(r["status"] == "stopped" for r in result.runs))
        doc = {
            "task": task,
            "steps": steps,
            "seeds": cfg.seed_list,
            "variants": result.summary(),
            "findings": result.findings(),
            "machine": result.machine,
            "wall_time_s": result.wall_time_s,
            "command": cfg.command(),
            "out": str(out) if out else None,
            "stopped": ctrl_c.message() if cut else None,
        }
        stopped = f"{ctrl_c.message()}: {len(result.runs)} of {total} runs made\n\n"
        emit(
            doc,
            as_json,
            lambda d: (
                (stopped if d["stopped"] else "")
                + table(d["variants"], _QK_COLS)
                + "\n\n"
                + "\n".join(f"- {s}" for s in d["findings"])
            ),
        )
        if cut:
            raise typer.Exit(ctrl_c.code)

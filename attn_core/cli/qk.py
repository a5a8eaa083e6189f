"""``compare-qk``: merged vs factored QK, trained side by side on the same data."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, emit, guarded, settings_options, table
from attn_core.declarations import flagged
from attn_core.qk import CompareConfig

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


COMPARE_SETTINGS = flagged(CompareConfig)  # compare-qk's options: its declared settings, in their order


@app.command("compare-qk")
@guarded
@settings_options(CompareConfig, COMPARE_SETTINGS)
def compare_qk_cmd(
    settings: dict = None,  # the comparison's settings, their options generated from CompareConfig
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

    merged = settings.pop("merged_kinds")
    kinds = tuple(k.strip() for k in merged.split(",") if k.strip() and k.strip() != "none")
    d_qks = _int_list(settings.pop("d_qks"), "--d-qk")
    cfg = CompareConfig(**settings, d_qks=d_qks, merged_kinds=kinds)
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
            "task": cfg.task,
            "steps": cfg.steps,
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

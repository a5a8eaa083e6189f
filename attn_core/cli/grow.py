"""``grow``: widen d_k of one head along the functional gradient, then compare with
random and zero growth after the same fine-tuning."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, NameArg, command_line, emit, guarded, needs_task, settings_options, table
from attn_core.declarations import flagged
from attn_core.grow import GrowConfig

app = typer.Typer()


GROW_SETTINGS = flagged(GrowConfig)  # grow's options: its declared settings, in their order


@app.command("grow")
@guarded
@settings_options(GrowConfig, GROW_SETTINGS, required=("add",))
def grow_cmd(
    name: str = NameArg,
    settings: dict = None,  # grow's settings, their options generated from GrowConfig
    out: Path | None = typer.Option(None, help="Save the grown, fine-tuned model in this new folder."),
    as_json: bool = JsonOpt,
):
    """Grow d_k of one head along the functional gradient: fit the descent target of the
    scores by batch least squares, truncate to rank d_k + p, pick the step by line search, then
    fine-tune and compare with random and zero growth."""
    from attn_core import checkpoint, destinations, grow
    from attn_core.card import Card
    from attn_core.sources import resolve
    from attn_core.training.interrupt import exit_on_ctrl_c

    cfg = GrowConfig(**settings)  # a bad setting is said before the model loads
    loaded = resolve(name)
    needs_task(loaded, "there is no loss to grow it on")
    if out is not None:
        destinations.check_destination(out)  # exists, or cannot be written: said before the work
    layer, head, steps, seed, eval_samples = cfg.layer, cfg.head, cfg.steps, cfg.seed, cfg.eval_samples
    with exit_on_ctrl_c("nothing was saved" + (f" ({out} was not written)" if out else "")):
        res = grow.grow(loaded.model, loaded.task, cfg)
    summary = {"name": loaded.name, "task": loaded.task.name, **res.summary()}
    if out is not None:
        card = Card(
            name=out.name,
            task=loaded.task.name,
            parent=loaded.name,
            description=f"{loaded.name} with head {head} of layer {layer} grown from d_k {res.d_k} to "
            f"{res.kept}, then fine-tuned {steps} steps",
            metrics={
                "accuracy": summary["accuracy_after_finetune"],
                "loss": summary["loss_after_finetune"],
                "eval_samples": eval_samples,
                "split": "test",
            },
            seed=seed,
            command=command_line(),
            details={"grow": summary},
        )
        with exit_on_ctrl_c(f"{out} was not written"):
            checkpoint.save(res.models["grown_finetuned"].cpu(), out, card)
        summary["out"] = str(out)

    def human(r):
        rows = [
            {
                "method": m,
                "loss after growth": r["loss_after_step"] if m == "grown" else r["baselines"][m]["loss_after_init"],
                f"after {steps} steps": r["loss_after_finetune"]
                if m == "grown"
                else r["baselines"][m]["loss_after_finetune"],
            }
            for m in ("grown", "random", "zero")
        ]
        sig = ", ".join(f"{s:.3g}" for s in r["singular_values_Z"][: r["kept"] + 3])
        return (
            f"{r['name']} L{layer}H{head}: d_k {r['d_k']} -> {r['d_k_new']}, loss before {r['loss_before']:.4g}\n"
            f"sigma(Z*) {sig}{' ...' if len(r['singular_values_Z']) > r['kept'] + 3 else ''} (cut after {r['kept']})\n"
            f"discarded energy {r['discarded_energy']:.3g} ({r['discarded_share']:.2%}), residual {r['residual']:.3g}\n"
            f"step eta {r['eta']:.3g}: predicted decrease {r['predicted_decrease']:.3g}, "
            f"measured {r['measured_decrease']:.3g} (fitting batch)\n"
            + table(rows, list(rows[0]))
            + (f"\nsaved to {r['out']}" if r.get("out") else "")
        )

    emit(summary, as_json, human)

"""The gallery's pages whose figures need training first: Retrain (a short live job's charts),
Runs (its runs side by side), Sweeps (a small sweep's trials, before any and after), Grow d_k,
Merged vs factored QK (the saved comparison and a fresh small one) and the Attention explorer.
Runs and sweeps go into the gallery's own temporary run store, never the user's."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from attn_core import bilinear, sources
from attn_core.card import Card
from attn_core.figures import bilinear as fb
from attn_core.figures import training as ft
from attn_core.gallery.pages import FULL, HALF, THREE_FIFTHS, TWO_THIRDS, Entry
from attn_core.runs import RunStore
from attn_core.sources import LoadedModel


def retrain_and_runs(m: LoadedModel, quick: bool, store: RunStore) -> Iterator[Entry]:
    """Two short retrains of ``m`` (the Retrain page's live charts of the first, the Runs page's
    comparison of both with their parent)."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    steps = 20 if quick else 120
    ids, snaps = [], []
    for regs in ({"entropy": 0.5}, {"vocab_entropy": 0.1, "spectral": 0.01}):
        cfg = JobConfig(
            source=m.name,
            regularizers=regs,
            steps=steps,
            eval_every=10,
            eval_samples=32,
            measure_samples=64,
            telemetry_every=5,
            spectrum_every=5,
            device="cpu",
        )
        job = TrainingJob.open(cfg, store=store)
        job.watch(1, 0)  # the Retrain page's watched head: its probe pattern is computed
        ids.append(job.run()["run_id"])
        snaps.append(job.snapshot())
    snap, page = snaps[0], f"Retrain · {m.name}"
    log = snap.metrics()
    yield Entry(page, "live curves", ft.curves_plot(log, title=f"Retraining {m.name}"), FULL)
    yield Entry(page, "entropy per head", ft.head_entropy_plot(log, "data", regularized=snap.regularized_heads), HALF)
    yield Entry(
        page,
        "attention on the probe input",
        ft.probe_pattern_plot(snap.pattern_of(1, 0), snap.probe_tokens, 1, 0, snap.probe_step),
        HALF,
    )
    yield Entry(page, "singular values over training", ft.spectrum_history_plot(log, "L1H0"), FULL)
    page = f"Runs · {m.name}"
    runs = {r["id"]: r for r in store.list_runs()}
    for run_id in ids:
        yield Entry(
            page,
            f"curves of {run_id}",
            ft.curves_plot(
                store.metrics(run_id), title=f"{run_id}: {', '.join(runs[run_id]['config']['regularizers'])}"
            ),
            HALF,
        )
    points = pd.DataFrame(
        [
            {
                "model": i,
                "accuracy": (runs[i]["summary"].get(when) or {}).get("accuracy"),
                "entropy_data": (runs[i]["summary"].get(when) or {}).get("entropy_data"),
                "when": when,
            }
            for i in ids
            for when in ("before", "after")
        ]
    )
    yield Entry(
        page,
        "accuracy against concentration",
        ft.tradeoff_plot(
            points,
            x="entropy_data",
            y="accuracy",
            color="model",
            title="Held-out accuracy against mean normalized entropy (regularized heads)",
        ),
        FULL,
    )
    for run_id in ids:
        per_head = Card.from_dict(store.get(run_id)["card"]).details["per_head"]
        yield Entry(
            page, f"spectra of {run_id}", ft.spectra_before_after_plot(per_head["before"], per_head["after"]), HALF
        )
    tokens = bilinear.sample_tokens(m, 0)
    from attn_core.sources import resolve

    for name in [m.name, *(f"run:{i}" for i in ids)]:
        other = resolve(name, store=store)
        yield Entry(
            page, f"heatmap of {name}", fb.view_plot(bilinear.sequence_view(other, tokens, 1), 0, value="pattern"), HALF
        )


def retrain_wide_text(folder, quick: bool, store: RunStore) -> Iterator[Entry]:
    """The Retrain page's charts of a model with 24 heads retrained on text (a short run of
    ``models.wide_llama_on_text`` in a folder whose path is long): 24 lines and legend entries
    per chart, perplexity, the source's path in the titles."""
    from attn_core.figures import text as ftext
    from attn_core.gallery.models import wide_llama_on_text
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    model, text = wide_llama_on_text(folder)
    cfg = JobConfig(
        source=str(model),
        text=str(text),
        block=16,
        regularizers={"entropy": 0.1},
        heads="L0",
        steps=4 if quick else 20,
        eval_every=2,
        eval_samples=8,
        measure_samples=16,
        telemetry_every=1,
        spectrum_every=1,
        device="cpu",
    )
    job = TrainingJob.open(cfg, store=store)
    job.run()
    snap, page = job.snapshot(), "Retrain · 24 heads on text"
    log = snap.metrics()
    yield Entry(page, "live curves", ft.curves_plot(log, title=f"Retraining {sources.shown_name(job.parent)}"), FULL)
    ppl = ftext.perplexity_plot(
        log, title=f"Perplexity of {sources.shown_name(job.parent)}", before=(snap.before or {}).get("perplexity")
    )
    yield Entry(page, "perplexity", ppl, FULL)
    yield Entry(page, "entropy per head", ft.head_entropy_plot(log, "data", regularized=snap.regularized_heads), HALF)
    yield Entry(page, "singular values over training", ft.spectrum_history_plot(log, "L0H13"), FULL)


def dynamics_page(m: LoadedModel, quick: bool, store: RunStore) -> Iterator[Entry]:
    """The Dynamics page for a series of model folders, one per step: ``m`` and the gallery's
    retrained runs of it (made by :func:`retrain_and_runs`): the views of one step at the widths
    the page gives them, the curves, and the animation across steps."""
    from attn_core import circuits
    from attn_core import dynamics as D
    from attn_core.figures import circuits as fc
    from attn_core.figures import dynamics as fd
    from attn_core.sources import resolve

    ids = [
        r["id"]
        for r in sorted(store.list_runs(), key=lambda r: r["created"])
        if r["has_weights"]
        and not r.get("sweep")
        and r.get("parent") == m.name  # the store holds other models' runs too
    ]
    names = [m.name, *(f"run:{i}" for i in ids[:2])]
    series = D.series(names, [0, *range(20, 20 * len(names), 20)], store=store)
    dyn = D.dynamics(series, D.default_inputs(series, store=store, samples=32), detector_samples=8, store=store)
    page = f"Dynamics · {m.name}"
    last = resolve(names[-1], store=store)
    tokens = bilinear.sample_tokens(m, 0)
    view = bilinear.sequence_view(last, tokens, 1)
    yield Entry(page, "the step's heatmap", fb.view_plot(view, 0, value="scores"), HALF)
    yield Entry(
        page, "the step's spectrum", fb.spectrum_plot(bilinear.spectrum_frame(last.model).query("layer == 1")), HALF
    )
    comp = circuits.composition(last.model, n_samples=16, seed=0)
    yield Entry(page, "the step's composition", fc.composition_plot(comp, width=HALF), HALF)
    yield Entry(
        page, "the step's head detectors", fb.heads_plot(bilinear.head_detectors(last.model, n_samples=8)), FULL
    )
    for plot in fd.panels(dyn, 1, 0, dyn.steps[-1]):
        yield Entry(page, plot.name, plot, HALF)
    loaded = [resolve(n, store=store) for n in names]
    views = [bilinear.sequence_view(x, tokens, 1) for x in loaded]
    spectra = [bilinear.spectrum_frame(x.model).query("layer == 1 and head == 0") for x in loaded]
    yield Entry(page, "the animation across steps", fd.animation_plot(series.steps, views, spectra, 0), FULL)


def sweeps(m: LoadedModel, quick: bool, store: RunStore) -> Iterator[Entry]:
    """A sweep of ``m`` before any trial is recorded and after all (trials run here, no Ray)."""
    from attn_core.figures import sweep as fs
    from attn_core.sweep import grid_plan, record_trial, run_trial, start_sweep, sweep_result

    page = f"Sweeps · {m.name}"
    plan = grid_plan(
        m.name, {"entropy": [0.1, 1.0], "hoyer": [0.1, 1.0]}, 1, steps=3 if quick else 30, measure_samples=64
    )
    sweep_id, _ = start_sweep(plan, store)
    yield Entry(page, "Pareto scatter, no trial yet", fs.pareto_plot(sweep_result(store, sweep_id)), FULL)
    for trial in plan.trials:
        record_trial(store, sweep_id, run_trial(trial.to_dict(), plan.job))
    store.update_sweep(sweep_id, "completed")
    result = sweep_result(store, sweep_id)
    for view in ("data", "vocab"):
        yield Entry(page, f"Pareto scatter, entropy {view}", fs.pareto_plot(result, view), FULL)


def grow_page(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    from attn_core import grow
    from attn_core.figures import grow as fg

    page = f"Grow d_k · {m.name}"
    cfg = grow.GrowConfig(
        layer=1, head=0, add=2, batch=8 if quick else 32, steps=5 if quick else 50, eval_samples=32, eval_every=5
    )
    res = grow.grow(m.model, m.task, cfg)
    yield Entry(page, "spectrum with its cut", fg.spectrum_plot(res), THREE_FIFTHS)
    yield Entry(page, "predicted vs measured decrease", fg.decrease_plot(res), THREE_FIFTHS)
    yield Entry(page, "loss during fine-tuning", fg.curves_plot(res), HALF)
    yield Entry(page, "held-out loss of the three methods", fg.summary_plot(res), HALF)
    tokens = bilinear.sample_tokens(m, 0)
    after = LoadedModel(
        name=f"{m.name} (grown)", model=res.models["grown"], config=res.models["grown"].cfg, card=m.card
    )
    before_plot, after_plot = fg.heatmap_pair(
        bilinear.sequence_view(m, tokens, 1, [0]), bilinear.sequence_view(after, tokens, 1, [0]), 0, value="pattern"
    )
    yield Entry(page, "the head before", before_plot, HALF)
    yield Entry(page, "the head after", after_plot, HALF)


def qk_page(quick: bool) -> Iterator[Entry]:
    from attn_core import qk as Q
    from attn_core.figures import qk as fq

    saved = Q.Comparison.load(Q.results_path())
    for plot in fq.all_plots(saved):
        yield Entry("Merged vs factored QK · saved", plot.name, plot, FULL)
    cfg = Q.CompareConfig(
        steps=10 if quick else 100, seeds=1, d_qks=(2, 16), eval_every=5, eval_samples=32, measure_samples=32
    )
    fresh = Q.compare(cfg, store=False)
    for plot in fq.all_plots(fresh):
        yield Entry("Merged vs factored QK · fresh", plot.name, plot, FULL)


def explorer(quick: bool) -> Iterator[Entry]:
    from attn_core import toy_attention as ta
    from attn_core.figures import toy

    page = "Attention explorer"
    means = ta.orthonormal_means(4, 8)
    shared = dict(
        a=0, b=1, alpha=1e-4, beta=10.0, big_var_index=0, big_var=0.5, n_samples=500 if quick else 2000, seed=0
    )
    pair = [ta.experiment(means, case="average", n_heads=h, **shared) for h in ta.HEAD_COUNTS]
    yield Entry(page, "attention weights", toy.weights_plot(pair[0]), FULL)
    yield Entry(page, "the output c", toy.output_plot(pair[0]), TWO_THIRDS)
    yield Entry(page, "α_a over the samples", toy.alpha_histogram([pair[0]]), FULL)
    yield Entry(page, "one head vs two", toy.head_comparison_plot(pair), FULL)
    yield Entry(
        page,
        "α_a, one head vs two",
        toy.alpha_histogram(pair, name="toy_alpha_a_hist_heads", title="α_a over the same key draws: one head vs two"),
        FULL,
    )

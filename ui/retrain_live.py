"""The Retrain page's live view: the status line and metrics, the curves (and perplexity on text)
and the per-head views (entropy per head, the watched head's attention on the probe and its
spectrum over training). Before a run the views show the model as it is (what a job logs at step
0, ``job.preview``), and the live charts continue from there.

Three fragments rerun on their own timers, so a refresh never reruns the settings above them:
the status and metrics every REFRESH_S; the curves every CURVES_S; the per-head views, whose data
changes only every telemetry/spectrum interval, every VIEWS_S (redrawing them as often only makes
them flicker, and costs the browser a chart from scratch each time)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from attn_core import regularizers as R
from attn_core import sources
from attn_core.figures import Plot
from attn_core.figures import text as ftext
from attn_core.figures import training as ft
from attn_core.retraining.job import TrainingJob, preview
from attn_core.sources import LoadedModel
from attn_core.training.config import JobConfig
from attn_core.training.estimate import range_text
from attn_core.training.slots import running_jobs
from attn_core.training.snapshot import Snapshot
from attn_core.training.telemetry import MetricKey
from ui.cache import cached
from ui.plots import show_plot, show_table
from ui.queue_view import who

JOB = "retrain_job"  # session key of the running (or last) TrainingJob
WATCHED = "retrain_watched_job"  # a job of another session this session shows (current_job)
SHOWN = "retrain_reloaded_for"  # run id for which the page was rerun once after the job ended
CHARTS = "retrain_live_charts"  # {name: (job, data version, Plot)} of the live view
CURVES = ("task_loss", "loss", "eval_loss", "accuracy", "eval_accuracy")  # what curves_plot draws, with term:*
REFRESH_S = 0.2  # status and metrics (the job trains in its own process: the server has time to spare)
CURVES_S = 2.0  # the curves (a redraw costs the browser far more than the status line)
LIVE_POINTS = 400  # points per curve while the run trains
VIEWS_S = 4.0  # per-head entropy, attention and spectrum (their data changes every 20-50 steps)


@dataclass(frozen=True)
class Watch:
    """What the live view shows before a run (the preview's settings) and which head it watches."""

    loaded: LoadedModel
    source: str  # the job's source (zoo name, run:<id> or an upload's folder)
    specs: tuple[str, ...]  # the regularizers, as spec strings
    heads: str | None  # the regularized heads (a head selection), None for all
    alpha: float | None
    seed: int
    layer: int
    head: int
    text: dict | None  # the text settings of an imported model ({} for a task model; None: not chosen yet)

    @property
    def label(self) -> str:
        return R.head_label(self.layer, self.head)


def current_job() -> TrainingJob | None:
    """The job the page shows: this session's; in a session that has started none, the newest
    job of this server that trains (started in another tab or by another user), followed to its
    end, until this session starts its own."""
    job = st.session_state.get(JOB)
    if job is not None:
        return job
    live = running_jobs(*who())  # the user's own (an admin's: every one)
    if live:
        st.session_state[WATCHED] = live[-1]
    return st.session_state.get(WATCHED)


def running() -> bool:
    """Whether the job the page shows trains (its views refresh on their timers)."""
    job = current_job()
    return job is not None and not job.snapshot().done


def own_running() -> bool:
    """Whether this session's own job trains (Start waits for it, Stop stops it)."""
    job = st.session_state.get(JOB)
    return job is not None and not job.snapshot().done


def show(watch: Watch) -> None:
    """The status line, the curves and the per-head views, each a fragment on its own timer
    while a run trains."""
    live = running()
    st.fragment(run_every=REFRESH_S if live else None)(live_status)(watch)
    st.fragment(run_every=CURVES_S if live else None)(live_curves)()
    st.fragment(run_every=VIEWS_S if live else None)(live_views)(watch)


def shown_plots(job: TrainingJob) -> list[Plot]:
    """The live charts last drawn for ``job`` (what the page's zip holds)."""
    return [plot for j, _, plot in st.session_state.get(CHARTS, {}).values() if j is job]


def live_chart(name: str, version: Any, build: Callable[[], Plot]) -> Plot:
    """The live chart ``name`` of the current job (or of the preview, with no job), rebuilt only
    when ``version`` (what its data depends on) changed since it was last built."""
    charts = st.session_state.setdefault(CHARTS, {})
    job_then, version_then, plot = charts.get(name, (None, None, None))
    current = current_job()
    if plot is None or job_then is not current or version_then != version:
        plot = build()
        charts[name] = (current, version, plot)
    return plot


@cached
def parent_view(model, source: str, regularizers: list, heads, entmax_alpha, seed: int, **text) -> Snapshot:
    """What a job with these settings logs at step 0 (the model as it is), measured on the CPU;
    ``model`` (the LoadedModel of ``source``) keys the cache by its weights; ``text`` the text
    settings of an imported model (its probe is held-out text)."""
    return preview(
        JobConfig(
            source=source,
            regularizers=regularizers,
            heads=heads,
            entmax_alpha=entmax_alpha,
            seed=seed,
            device="cpu",
            **text,
        ),
        model.model,  # the page's loaded weights: nothing is read again
    )


def select(log: pd.DataFrame, names, prefix: str) -> pd.DataFrame:
    """The rows of the metric log named one of ``names`` or starting with ``prefix``."""
    name = log["name"].astype(str)
    return log[name.isin(list(names)) | name.str.startswith(prefix)]


def select_keys(log: pd.DataFrame, metrics, layer=None, head=None) -> pd.DataFrame:
    """The rows of the metric log whose name is a MetricKey of one of ``metrics`` (of head
    ``layer``, ``head`` when given)."""
    name = log["name"].astype(str)
    keys = {n: MetricKey.try_parse(n) for n in name.unique()}
    wanted = [
        n
        for n, k in keys.items()
        if k is not None and k.metric in metrics and (layer is None or (k.layer, k.head) == (layer, head))
    ]
    return log[name.isin(wanted)]


def thinned(log: pd.DataFrame) -> pd.DataFrame:
    """Every k-th step of the per-step curves, so a live chart never sends more than about
    LIVE_POINTS points per line (held-out evaluations are rare and all kept); the final chart
    and its downloads have every step."""
    stride = max(1, -(-int(log["step"].max() if len(log) else 0) // LIVE_POINTS))
    keep = (
        (log["step"] % stride == 0)
        | log["name"].astype(str).str.startswith("eval_")
        | (log["step"] == log["step"].max())
    )
    return log[keep]


def live_status(watch: Watch) -> None:
    current = current_job()
    if current is None:
        st.info("No run yet: choose penalties and press **Start**.")
        # the curves' place is kept: the page has the same charts before, during and after a run
        show_plot(
            ft.waiting_plot("training_curves", f"Retraining {watch.loaded.name}", "the curves start when a run starts"),
            key="live_curves",
            downloads=False,
        )
        return
    snap = current.snapshot()
    facts = getattr(current.task, "facts", None)  # a run on text: its throughput in tokens too
    per_step = current.train_cfg.batch_size * facts["block"] if facts else 0
    st.progress(
        snap.progress,
        text=f"{snap.status}: step {snap.step} / {snap.steps}"
        + (f" · {snap.steps_per_s:.1f} steps/s" if snap.step else "")
        + (f" · compiled in {snap.compile_s:.1f} s" if snap.compile_s else "")
        + (f" · {snap.steps_per_s * per_step:,.0f} tokens/s" if snap.step and per_step else "")
        + (f" · {range_text(*snap.left_s)} left" if snap.left_s is not None and not snap.done else ""),
    )
    _status_message(snap)
    _metrics(snap, on_text=facts is not None)
    if snap.workers:  # a run on Ray Train workers: each one's throughput and memory
        show_table(snap.workers_table(), hide_index=True)
    if snap.done and st.session_state.get(SHOWN) != snap.run_id:
        # Once per run: rerun the whole page so the sidebar lists the new run, Start is enabled
        # and the timers stop.
        st.session_state[SHOWN] = snap.run_id
        st.rerun()


def _status_message(snap: Snapshot) -> None:
    if snap.status == "diverged":
        st.error(f"The run diverged: {snap.message}.")
    elif snap.status == "failed":
        st.error(f"The run failed: {snap.message}.")
    elif snap.done and snap.run_id is None:
        st.info(f"The run {snap.message}.")
    elif snap.done:
        st.success(
            f"Run `{snap.run_id}` {snap.message}; saved as `run:{snap.run_id}` (pick it in the sidebar, "
            "compare it on the Runs page)."
        )
    elif snap.status == "queued":
        st.info(
            f"Waiting to train, {snap.message}: it starts by itself when its turn comes (Stop leaves the line).",
            icon=":material/hourglass_top:",
        )
    elif snap.status == "pending" or snap.step == 0:
        st.caption("Measuring the model before training…")


def _metrics(snap: Snapshot, on_text: bool) -> None:
    latest = snap.latest
    terms = [n for n in latest if n.startswith("term:")]
    cols = st.columns(3 + on_text + len(terms))
    cols[0].metric(
        "task loss",
        f"{latest['task_loss']:.4g}" if "task_loss" in latest else "–",
        help="Cross-entropy of the next-token predictions on the training batch, in nats",
    )
    cols[1].metric(
        "accuracy",
        f"{latest['accuracy']:.1%}" if "accuracy" in latest else "–",
        help="Fraction of scored tokens predicted right on the training batch",
    )
    cols[2].metric(
        "entropy",
        f"{latest['entropy_data']:.3f}" if "entropy_data" in latest else "–",
        help="Mean normalized attention entropy H/log n of the regularized heads on a fixed held-out "
        "probe batch: 0 = one key per query, 1 = uniform",
    )
    if on_text:
        cols[3].metric(
            "held-out perplexity",
            f"{math.exp(min(latest['eval_loss'], 700)):.4g}" if "eval_loss" in latest else "–",
            help="exp of the mean next-token loss on held-out blocks of the text (per token)",
        )
    for col, name in zip(cols[3 + on_text :], terms):
        col.metric(
            f"λ·R {name.removeprefix('term:')}", f"{latest[name]:.4g}", help="This regularizer's term λ·R in the loss"
        )


def live_curves() -> None:
    current = current_job()
    if current is None:
        return
    snap = current.snapshot()
    log = select(snap.metrics(), CURVES, "term:")
    plot = live_chart(
        "curves",
        (snap.step, snap.status),
        lambda: ft.curves_plot(
            log if snap.done else thinned(log), title=f"Retraining {sources.shown_name(current.parent)}"
        ),
    )
    show_plot(plot, key="live_curves", downloads=snap.done)  # downloads once the run has ended
    if getattr(current.task, "facts", None) is not None:  # a run on text: perplexity, exp(loss)
        ppl = live_chart(
            "perplexity",
            (snap.step, snap.status),
            lambda: ftext.perplexity_plot(
                log if snap.done else thinned(log),
                title=f"Perplexity of {current.parent}",
                before=(snap.before or {}).get("perplexity"),
            ),
        )
        show_plot(ppl, key="live_perplexity", downloads=snap.done)


def _preview(watch: Watch) -> tuple[Snapshot, tuple] | None:
    """Before any run: the model as it is, where a run's charts start (None: it cannot be measured)."""
    text = watch.text or {}
    text_view = {k: text[k] for k in ("text", "text_field", "eval_text", "block")} if text else {}
    try:
        snap = parent_view(
            watch.loaded, watch.source, list(watch.specs), watch.heads, watch.alpha, watch.seed, **text_view
        )
    except ValueError as e:
        st.warning(f"The model could not be measured with these settings: {e}")
        return None
    st.caption(
        f"Step 0: {watch.loaded.name} as it is, measured as a run measures it; a run's charts continue from here."
    )
    version = ("preview", watch.loaded.key, watch.specs, watch.heads, watch.alpha, watch.seed, str(text_view))
    return snap, version


def live_views(watch: Watch) -> None:
    current = current_job()
    layer, head = watch.layer, watch.head
    if current is None and watch.text is None:
        st.info("Choose a text: the heads are then shown on held-out blocks of it before the run starts.")
        return
    if current is None:
        measured = _preview(watch)
        if measured is None:
            return
        snap, version = measured
    else:
        snap = current.snapshot()
        if layer >= snap.n_layers or head >= snap.n_heads:  # another model was picked since the run began
            st.info(f"The run retrains {current.parent}, which has no head {watch.label}: pick a head of it to watch.")
            return
        version = ()
    log = snap.metrics()
    left, right = st.columns(2)
    with left:
        entropy = select_keys(log, ("entropy_data",))
        plot = live_chart(
            "entropy",
            (version, snap.probe_step),
            lambda: ft.head_entropy_plot(entropy, "data", regularized=snap.regularized_heads),
        )
        show_plot(plot, key="live_entropy", downloads=snap.done)
    with right:
        if current is not None:
            current.watch(layer, head)  # the job computes this head's probe pattern, and no other
        pattern = snap.pattern_of(layer, head) if current is None else current.pattern(layer, head)
        if pattern is not None:
            plot = live_chart(
                "pattern",
                (version, snap.probe_step, layer, head),
                lambda: ft.probe_pattern_plot(pattern, snap.probe_tokens, layer, head, snap.probe_step),
            )
        else:  # the same chart in the same place until the first probe is measured
            plot = ft.waiting_plot(
                f"probe_pattern_L{layer}H{head}", f"Attention of L{layer}H{head} on the probe input", "measuring…"
            )
        show_plot(plot, key="live_pattern", downloads=snap.done and pattern is not None)
    spectra = select_keys(log, ("sigma", "stable_rank"), layer, head)
    if len(spectra):
        plot = live_chart(
            "spectrum", (version, watch.label, len(spectra)), lambda: ft.spectrum_history_plot(spectra, watch.label)
        )
    else:  # the same chart in the same place until the first spectrum is measured
        plot = ft.waiting_plot(
            f"spectrum_history_{watch.label}",
            f"Singular values of B over training, {watch.label}",
            "measured every few steps; the first comes soon",
        )
    show_plot(plot, key="live_spectrum", downloads=snap.done and bool(len(spectra)))

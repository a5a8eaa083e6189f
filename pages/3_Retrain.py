"""Regularize and retrain the picked model while watching it: losses, each regularizer's term,
per-head entropy, the watched head's spectrum and its attention, refreshed live. The training runs
in a worker process of its own (attn_core.training.worker), never in the server's interpreter;
this page only starts, stops and draws its snapshots. Before a run
the per-head views show the model as it is (what a job logs at step 0, ``job.preview``), and the
live charts continue from there."""

import math

import pandas as pd
import streamlit as st
import torch

import ui
from attn_core import bilinear, card
from attn_core import regularizers as R
from attn_core.figures import text as ftext
from attn_core.figures import training as ft
from attn_core.runs import RunStore
from attn_core.text import files as text_files
from attn_core.text.corpus import open_corpus
from attn_core.text.source import prepare_text
from attn_core.text.task import HELD_OUT_FRACTION, split_streams
from attn_core.training.config import TRAIN, TRAIN_HELP, JobConfig
from attn_core.training.device import PRECISIONS, available_devices
from attn_core.training.job import TrainingJob, preview
from attn_core.training.snapshot import Snapshot
from attn_core.training.telemetry import MetricKey
from attn_core.validate import default

JOB = "retrain_job"  # session key of the running (or last) TrainingJob
SHOWN = "retrain_reloaded_for"  # run id for which the page was rerun once after the job ended
CHARTS = "retrain_live_charts"  # {name: (job, data version, Plot)} of the live view
CURVES = ("task_loss", "loss", "eval_loss", "accuracy", "eval_accuracy")  # what curves_plot draws, with term:*
REFRESH_S = 0.2  # status and metrics (the job trains in its own process: the server has time to spare)
CURVES_S = 2.0  # the curves (a redraw costs the browser far more than the status line)
LIVE_POINTS = 400  # points per curve while the run trains
VIEWS_S = 4.0  # per-head entropy, attention and spectrum (their data changes every 20-50 steps)
# Log-scale choices: 1e-5 .. 10 in quarter decades, 1e-5 .. 1e-1 for the learning rate.
LAMBDAS = [round(10 ** (e / 4), 8) for e in range(-20, 5)]
RATES = [round(10 ** (e / 4), 8) for e in range(-20, -3)]
ALPHAS = {
    None: "the model's own",
    1.0: "1 (softmax)",
    1.25: "1.25",
    1.5: "1.5 (entmax15)",
    1.75: "1.75",
    2.0: "2 (sparsemax)",
}
SCOPES = {"head": "the watched head", "layer": "its layer", "all": "every head"}

loaded = ui.setup("Regularize and retrain")
cfg = loaded.config
st.markdown(
    "Add concentration penalties $\\lambda R$ to the task loss and retrain the model picked in the sidebar. "
    "The run trains in the background: watch its curves, the per-head entropy, the singular values of the "
    "watched head's $B$ and its attention move; stop it at any time. Every run is saved and appears in "
    "**Runs** and in the sidebar as `run:<id>`."
)
# an imported model (no task) with its tokenizer.json retrains on a text the user gives (attn_core.text)
text_mode = loaded.task is None and bilinear.tokenizer(loaded) is not None
if not text_mode:
    ui.require_task(loaded, "there is nothing to retrain it on (an imported model needs its tokenizer.json)")

job = st.session_state.get(JOB)
running = job is not None and not job.snapshot().done

# --- settings ------------------------------------------------------------------------------------
reg_col, head_col, opt_col = st.columns([3, 2, 2])
with reg_col:
    st.subheader("Regularizers")
    names = st.multiselect(
        "Penalties",
        list(R.REGULARIZERS),
        key=ui.remember("reg_names", ["entropy"]),
        format_func=lambda n: n.replace("_", " "),
        help="; ".join(f"{n}: {what}" for n, (_, what) in R.REGULARIZERS.items()),
    )
    specs = []
    for name in names:
        lam_col, k_col = st.columns([3, 1])
        lam = lam_col.select_slider(
            f"λ of {name.replace('_', ' ')}",
            LAMBDAS,
            format_func=lambda v: f"{v:.3g}",
            key=ui.remember(f"reg_lambda_{name}", 0.1, LAMBDAS),
            help=f"Strength of λ·R (log scale); R = {R.REGULARIZERS[name][1]}",
        )
        k = 1
        if name.endswith("topk"):
            k = k_col.number_input(
                "k",
                min_value=1,
                max_value=cfg.n_ctx,
                step=1,
                key=ui.remember(f"reg_k_{name}", 1, range(1, cfg.n_ctx + 1)),
                help="Penalise 1 − (mass of the k largest attention weights)",
            )
        specs.append(R.RegSpec(name, lam, k=int(k)))
    penalty_rows = st.number_input(
        "Rows per head for the penalty (0 = all)",
        min_value=0,
        max_value=cfg.n_ctx,
        step=1,
        key=ui.remember("retrain_penalty_rows", 0, range(cfg.n_ctx + 1)),
        help="Entropy, Hoyer and top-k penalties from this many query rows per head, drawn at random each "
        "step: an unbiased estimate of the penalty and its gradient, cheaper on long sequences, noisier. "
        "0, or at least the sequence length, uses every row (the exact penalty). Other penalties are exact",
    )
with head_col:
    st.subheader("Watched head")
    layer, head = ui.layer_head_picker(cfg, head_help=": its spectrum and attention are drawn live")
    scope = st.radio(
        "Regularize",
        list(SCOPES),
        format_func=SCOPES.get,
        key=ui.remember("reg_scope", "head", list(SCOPES)),
        help="Which heads the penalties act on (the mean over them is penalised)",
    )
with opt_col:
    st.subheader("Training")
    alpha = st.select_slider(
        "entmax α",
        list(ALPHAS),
        format_func=ALPHAS.get,
        key=ui.remember("entmax_alpha", None, list(ALPHAS)),
        help="Attention normalisation: 1 softmax, 1.5 entmax15, 2 sparsemax (exact zeros)",
    )
    lr = st.select_slider(
        "Learning rate",
        RATES,
        format_func=lambda v: f"{v:.2g}",
        key=ui.remember("retrain_lr", default(JobConfig, "lr"), RATES),
        help="Peak AdamW learning rate (log scale; warmup, then cosine decay)",
    )
    s_col, seed_col = st.columns(2)
    steps = s_col.number_input(
        "Steps",
        min_value=1,
        max_value=100_000,
        step=50,
        key=ui.remember("retrain_steps", default(JobConfig, "steps"), range(1, 100_001)),
        help="Optimizer updates",
    )
    seed = seed_col.number_input(
        "Seed",
        min_value=0,
        max_value=2**31 - 1,
        step=1,
        key=ui.remember("retrain_seed", default(JobConfig, "seed"), range(2**31)),
        help="Seed of the training data: the same settings and seed give the same run",
    )
    devices = available_devices()
    d_col, p_col = st.columns(2)
    device = d_col.selectbox(
        "Device",
        devices,
        key=ui.remember("retrain_device", devices[-1], devices),
        help="Where the model trains; CUDA is listed only when a GPU is present",
    )
    precision = p_col.selectbox(
        "Precision",
        PRECISIONS,
        key=ui.remember("retrain_precision", default(JobConfig, "precision"), PRECISIONS),
        help="fp32, or bf16 autocast (forward and loss in bfloat16, weights and AdamW in fp32)",
    )
    compiled = st.checkbox(
        "Compile the training step",
        key=ui.remember("retrain_compile", default(JobConfig, "compile"), [False, True]),
        help="torch.compile of forward, loss and penalties (CUDA graphs on a GPU): compiling takes "
        "tens of seconds before the first step, then each step is faster. Falls back to the "
        "plain step if it cannot compile (the run's message says so).",
    )
    checkpoints = st.number_input(
        "Checkpoints (log-spaced)",
        min_value=0,
        max_value=500,
        step=10,
        key=ui.remember("retrain_checkpoints", 0, range(501)),
        help="Keep the weights at this many steps spaced evenly in log(step), plus step 0 and the last, in the "
        "run's folder (listed in its card): scrub them on the Dynamics page. 0 keeps none",
    )
watched = R.head_label(layer, head)
heads_spec = {"head": watched, "layer": f"L{layer}", "all": None}[scope]


def pick_text(origin: str, col, kind: str, listed: list[str]):
    """The path of a text picked in ``col``: an upload (kept by its hash in the run store) or a
    name under $ATTN_LAB_DATA; None until one is given. ``kind`` keys the widgets (text, eval)."""
    if origin == "upload":
        up = col.file_uploader(
            "Text file" if kind == "text" else "Held-out text file",
            type=["txt", "jsonl", "parquet"],
            max_upload_size=text_files.MAX_UPLOAD_MB,
            key=f"{kind}_upload",
            help="A .txt file, .jsonl (one JSON object per line) or Parquet",
        )
        return None if up is None else text_files.save_upload(up.name, up.getvalue())
    name = col.selectbox("File or folder", listed, key=ui.remember(f"{kind}_data", listed[0], listed))
    return text_files.data_path(name)


def text_inputs() -> dict | None:
    """The text an imported model retrains on (an upload, or a file under $ATTN_LAB_DATA), the
    held-out text (the last part of it, or another text: --eval-text), its blocks, what learns
    and the KL term; tokenized here with a progress bar (once: the cache keeps it). The
    JobConfig's text settings, or None until a usable text is chosen."""
    st.subheader("Text")
    src_col, pick_col, field_col = st.columns([2, 4, 2])
    listed = text_files.data_files()
    where = ["upload"] + (["data"] if listed else [])
    places = {"upload": "an upload", "data": "the data folder"}
    origin = src_col.radio(
        "Text from",
        where,
        format_func=places.get,
        key=ui.remember("text_from", "upload", where),
        help=f"Upload a file (at most {text_files.MAX_UPLOAD_MB} MB), or pick one in the folder the server "
        f"names in ${text_files.ENV_DATA}",
    )
    held_col, held_pick_col, _ = st.columns([2, 4, 2])
    held_from = held_col.radio(
        "Held out",
        ["tail", *where],
        format_func={"tail": f"the last {HELD_OUT_FRACTION:.0%} of the text", **places}.get,
        key=ui.remember("text_held", "tail", ["tail", *where]),
        help="The text perplexity is measured on: the end of the training text (never trained on), or "
        "another text (--eval-text)",
    )
    block_col, train_col, kl_col = st.columns([2, 4, 2])
    block = block_col.number_input(
        "Block (tokens)",
        min_value=2,
        max_value=cfg.n_ctx,
        step=16,
        key=ui.remember("text_block", min(cfg.n_ctx, 256), range(2, cfg.n_ctx + 1)),
        help="Tokens per training sequence: blocks of the text, each scored on every next token",
    )
    train = train_col.radio(
        "What learns", TRAIN, horizontal=True, key=ui.remember("text_train", "all", TRAIN), help=TRAIN_HELP
    )
    kl = kl_col.select_slider(
        "KL to the start (λ)",
        [0.0] + LAMBDAS,
        format_func=lambda v: "off" if v == 0 else f"{v:.3g}",
        key=ui.remember("text_kl", 0.0, [0.0] + LAMBDAS),
        help="λ·KL(starting model ‖ model) per token on the training batch: keeps behaviour while heads concentrate",
    )
    try:
        path = pick_text(origin, pick_col, "text", listed)
        held_path = None if held_from == "tail" else pick_text(held_from, held_pick_col, "eval", listed)
        if path is None:
            st.info("Upload a text to retrain on (or pick one in the data folder).")
            return None
        if held_from != "tail" and held_path is None:
            st.info("Upload the held-out text (or measure perplexity on the end of the training text).")
            return None
        field = None
        if {k for p in (path, held_path) if p is not None for k in open_corpus(p).kinds} - {"text"}:
            field = field_col.text_input(  # only .jsonl and Parquet files have fields
                "Text field",
                key=ui.remember("text_field", "text"),
                help="The JSON key (.jsonl) or Parquet column that holds the text",
            )
        bar = st.progress(0.0, text="Reading the text…")

        def progress(phase: str, done: int, total: int) -> None:
            bar.progress(min(1.0, done / max(total, 1)), text=f"{phase}: {done / 2**20:.1f} of {total / 2**20:.1f} MiB")

        source = ui.job_source(st.session_state[ui.MODEL_KEY])
        held_text = None if held_path is None else str(held_path)
        tf, *held_tf = prepare_text(source, str(path), field, held_text, RunStore(), progress)
        bar.empty()
        _, held, split = split_streams(tf, held_tf[0] if held_tf else None, int(block), cfg.d_vocab)
    except (ValueError, OSError) as e:
        st.error(f"This text cannot be used: {ui.plain(e)}")
        return None
    st.caption(
        f"{tf.n_tokens:,} tokens in {tf.meta['documents']:,} document(s), "
        + ("found in the token cache" if tf.cached else f"tokenized in {tf.meta['seconds']:.1f} s")
        + f"; {len(held):,} tokens held out for perplexity ({split['held_out'].replace('eval-text', 'another text')})"
        + f"; blocks of {int(block)} tokens."
    )
    return dict(
        text=str(path), text_field=field or None, eval_text=held_text, block=int(block), train=train, kl=float(kl)
    )


text_cfg = text_inputs() if text_mode else {}


def start() -> None:
    try:
        job_cfg = JobConfig(
            source=ui.job_source(st.session_state[ui.MODEL_KEY]),
            regularizers=specs,
            heads=heads_spec,
            entmax_alpha=alpha,
            steps=int(steps),
            lr=float(lr),
            seed=int(seed),
            device=device,
            precision=precision,
            compile=compiled,
            checkpoint_log=int(checkpoints) or None,
            penalty_rows=int(penalty_rows) or None,
            **(text_cfg or {}),
        )
        new = TrainingJob(job_cfg)
        # The page's own torch work (previews, views) keeps one intra-op thread: toy models gain
        # nothing from more, and the job's worker process has the other core.
        torch.set_num_threads(1)
        # at most $ATTN_LAB_MAX_JOBS jobs of this server train at once, each in a worker process
        # (one torch thread); the others wait in line
        st.session_state[JOB] = new.start(process=True)
    except ValueError as e:
        st.session_state["retrain_error"] = str(e)
        return
    st.session_state.pop("retrain_error", None)


def stop() -> None:
    st.session_state[JOB].stop()


b_start, b_stop, _ = st.columns([1, 1, 6])
b_start.button(
    "Start",
    type="primary",
    on_click=start,
    disabled=running or text_cfg is None,
    key="retrain_start",
    icon=":material/play_arrow:",
    help="Start a new run with these settings",
)
b_stop.button(
    "Stop",
    on_click=stop,
    disabled=not running,
    key="retrain_stop",
    icon=":material/stop:",
    help="Stop after the current step; the run is saved with the weights so far (a queued run leaves the line)",
)
if "retrain_error" in st.session_state:
    st.error(f"The run was not started: {st.session_state['retrain_error']}")


# --- live view -----------------------------------------------------------------------------------
# Three fragments rerun on their own timers, so a refresh never reruns the settings above: the
# status and metrics every REFRESH_S; the curves every CURVES_S; the per-head views, whose data
# changes only every telemetry/spectrum interval, every VIEWS_S (redrawing them as often only
# makes them flicker, and costs the browser a chart from scratch each time).
def live_chart(name: str, version, build):
    """The live chart ``name`` of the current job (or of the preview, with no job), rebuilt only
    when ``version`` (what its data depends on) changed since it was last built."""
    charts = st.session_state.setdefault(CHARTS, {})
    job_then, version_then, plot = charts.get(name, (None, None, None))
    current = st.session_state.get(JOB)
    if plot is None or job_then is not current or version_then != version:
        plot = build()
        charts[name] = (current, version, plot)
    return plot


@ui.cached
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
        )
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


@st.fragment(run_every=REFRESH_S if running else None)
def live_status() -> None:
    current = st.session_state.get(JOB)
    if current is None:
        st.info("No run yet: choose penalties and press **Start**.")
        # the curves' place is kept: the page has the same charts before, during and after a run
        ui.show_plot(
            ft.waiting_plot("training_curves", f"Retraining {loaded.name}", "the curves start when a run starts"),
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
        + (f" · {snap.steps_per_s * per_step:,.0f} tokens/s" if snap.step and per_step else ""),
    )
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
        st.info(f"Waiting to train, {snap.message}: it starts by itself when a job ahead ends (Stop leaves the line).")
    elif snap.status == "pending" or snap.step == 0:
        st.caption("Measuring the model before training…")

    latest = snap.latest
    terms = [n for n in latest if n.startswith("term:")]
    on_text = getattr(current.task, "facts", None) is not None  # a run on text also shows perplexity
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
        "entropy (regularized heads)",
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
    if snap.done and st.session_state.get(SHOWN) != snap.run_id:
        # Once per run: rerun the whole page so the sidebar lists the new run, Start is enabled
        # and the timers stop.
        st.session_state[SHOWN] = snap.run_id
        st.rerun()


@st.fragment(run_every=CURVES_S if running else None)
def live_curves() -> None:
    current = st.session_state.get(JOB)
    if current is None:
        return
    snap = current.snapshot()
    log = select(snap.metrics(), CURVES, "term:")
    plot = live_chart(
        "curves",
        (snap.step, snap.status),
        lambda: ft.curves_plot(log if snap.done else thinned(log), title=f"Retraining {current.parent}"),
    )
    ui.show_plot(plot, key="live_curves", downloads=snap.done)  # downloads once the run has ended
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
        ui.show_plot(ppl, key="live_perplexity", downloads=snap.done)


@st.fragment(run_every=VIEWS_S if running else None)
def live_views() -> None:
    current = st.session_state.get(JOB)
    if current is None and text_cfg is None:
        st.info("Choose a text: the heads are then shown on held-out blocks of it before the run starts.")
        return
    if current is None:  # before any run: the model as it is, where a run's charts start
        text_view = {k: text_cfg[k] for k in ("text", "text_field", "eval_text", "block")} if text_cfg else {}
        try:
            snap = parent_view(
                loaded,
                ui.job_source(st.session_state[ui.MODEL_KEY]),
                [str(s) for s in specs],
                heads_spec,
                alpha,
                int(seed),
                **text_view,
            )
        except ValueError as e:
            st.warning(f"The model could not be measured with these settings: {e}")
            return
        st.caption(f"Step 0: {loaded.name} as it is, measured as a run measures it; a run's charts continue from here.")
        version = ("preview", loaded.key, tuple(str(s) for s in specs), heads_spec, alpha, int(seed), str(text_view))
    else:
        snap = current.snapshot()
        if layer >= snap.n_layers or head >= snap.n_heads:  # another model was picked since the run began
            st.info(f"The run retrains {current.parent}, which has no head {watched}: pick a head of it to watch.")
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
        ui.show_plot(plot, key="live_entropy", downloads=snap.done)
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
        ui.show_plot(plot, key="live_pattern", downloads=snap.done and pattern is not None)
    spectra = select_keys(log, ("sigma", "stable_rank"), layer, head)
    if len(spectra):
        plot = live_chart(
            "spectrum", (version, watched, len(spectra)), lambda: ft.spectrum_history_plot(spectra, watched)
        )
    else:  # the same chart in the same place until the first spectrum is measured
        plot = ft.waiting_plot(
            f"spectrum_history_{watched}",
            f"Singular values of B over training, {watched}",
            "measured every few steps; the first comes soon",
        )
    ui.show_plot(plot, key="live_spectrum", downloads=snap.done and bool(len(spectra)))


if st.session_state.get(JOB) is not None:  # the run's command: it does not change while the run trains
    st.code(st.session_state[JOB].cfg.command(), language="bash")
live_status()
live_curves()
live_views()
job = st.session_state.get(JOB)
if job is not None and job.snapshot().done:
    snap = job.snapshot()
    shown = [plot for j, _, plot in st.session_state.get(CHARTS, {}).values() if j is job]
    ui.export_all(
        shown,
        {
            "page": "Retrain",
            "model": loaded.name,
            "run_id": snap.run_id,
            "status": snap.status,
            "message": snap.message,
            "watched_head": watched,
            "job": job.cfg.to_dict(),
            "before": card.public(snap.before) or {},
            "after": card.public(snap.after) or {},
        },
        key=f"retrain_{snap.run_id}",
    )

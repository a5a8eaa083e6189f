"""Regularize and retrain the picked model while watching it: losses, each regularizer's term,
per-head entropy, the watched head's spectrum and its attention, refreshed live. The training runs
in a worker process of its own (attn_core.training.worker), never in the server's interpreter,
or, when Ray sees more than one GPU or a cluster is named, on Ray Train workers
(attn_core.distributed, each worker's throughput shown); this page only starts, stops and draws
its snapshots. Before a run
the per-head views show the model as it is (what a job logs at step 0, ``job.preview``), and the
live charts continue from there."""

import streamlit as st
import torch

import ui
from attn_core import bilinear, card
from attn_core import regularizers as R
from attn_core.device import available_devices
from attn_core.retraining.job import TrainingJob
from attn_core.training.config import LAMBDAS, JobConfig
from attn_core.training.queue import JobQueue
from attn_core.training.scaling import workers_offer
from ui import queue_view
from ui import retrain_live as live
from ui.retrain_text import say_estimate, shown_command, text_inputs

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

queue = queue_view.keep()  # the server's job queue; entries of a server that ended are marked or taken over
running = live.own_running()  # another session's job is shown, but this one may start its own

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
        what = R.REGULARIZERS[name][1]
        lam = ui.setting_input(
            lam_col, JobConfig, "regularizers", f"reg_lambda_{name}", penalty=name.replace("_", " "), what=what
        )
        k = 1
        if name.endswith("topk"):  # at most the model's context
            k = ui.setting_input(k_col, R.RegSpec, "k", f"reg_k_{name}", max_value=cfg.n_ctx)
        specs.append(R.RegSpec(name, lam, k=int(k)))
    penalty_rows = ui.setting_input(st, JobConfig, "penalty_rows", "retrain_penalty_rows", max_value=cfg.n_ctx)
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
    alpha = ui.setting_input(st, JobConfig, "entmax_alpha", "entmax_alpha")
    lr = ui.setting_input(st, JobConfig, "lr", "retrain_lr")
    s_col, seed_col = st.columns(2)
    steps = ui.setting_input(s_col, JobConfig, "steps", "retrain_steps")
    seed = ui.setting_input(seed_col, JobConfig, "seed", "retrain_seed")
    devices = available_devices()
    d_col, p_col = st.columns(2)
    device = ui.setting_input(d_col, JobConfig, "device", "retrain_device", options=devices, value=devices[-1])
    precision = ui.setting_input(p_col, JobConfig, "precision", "retrain_precision")
    compiled = ui.setting_input(st, JobConfig, "compile", "retrain_compile")
    checkpoints = ui.setting_input(st, JobConfig, "checkpoint_log", "retrain_checkpoints")
    offer, spread = workers_offer(), {}  # workers when Ray sees more than one GPU, or a cluster
    if offer is not None:
        workers = ui.setting_input(
            st, JobConfig, "workers", "retrain_workers", max_value=offer["max_workers"], where=offer["where"]
        )
        if workers:
            w_col, g_col = st.columns(2)
            strategy = ui.setting_input(w_col, JobConfig, "strategy", "retrain_strategy")
            gpus = ui.setting_input(
                g_col, JobConfig, "gpus_per_worker", "retrain_gpus", options=offer["gpus"], value=offer["gpus"][0]
            )
            spread = dict(workers=int(workers), strategy=strategy, gpus_per_worker=gpus)
watched = R.head_label(layer, head)
heads_spec = {"head": watched, "layer": f"L{layer}", "all": None}[scope]


text_cfg = text_inputs(cfg, LAMBDAS, device) if text_mode else {}
if text_cfg is not None:  # how long it would take, before it starts
    parent_batch = JobConfig(source=ui.job_source(st.session_state[ui.MODEL_KEY])).train_config(loaded.card.train)
    batch = text_cfg.get("batch_size") or parent_batch.batch_size
    block = text_cfg.get("block") or loaded.task.seq_len
    say_estimate(loaded.model, int(steps), int(batch), int(block), device, text_cfg.get("kl", 0.0))


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
            device="auto" if spread else device,  # a worker trains on the device Ray gives it
            precision=precision,
            compile=compiled,
            checkpoint_log=int(checkpoints) or None,
            penalty_rows=int(penalty_rows) or None,
            **(text_cfg or {}),
            **spread,
        )
        # it waits its turn in the server's job queue (a per-user limit refuses here)
        new = TrainingJob.open(job_cfg, slots=queue or JobQueue(), user=queue_view.who()[0])
        # The page's own torch work (previews, views) keeps one intra-op thread: toy models gain
        # nothing from more, and the job's worker process has the other core.
        torch.set_num_threads(1)
        # at most $ATTN_LAB_MAX_JOBS jobs train at once per device, each in a worker process (its
        # torch threads chosen for the run: one for a small model); the others wait in the queue
        # a run on Ray Train workers: the server keeps the Ray it starts (shut down under the server's
        # other threads, Ray could end the server)
        st.session_state[live.JOB] = new.start(process=True, keep_ray=True)
    except ValueError as e:
        st.session_state["retrain_error"] = str(e)
        return
    st.session_state.pop("retrain_error", None)


def stop() -> None:
    live.current_job().stop()


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
queue_view.show(queue, "retrain")  # this user's jobs in the queue: place, wait, Cancel; interrupted ones


# --- live view: status, curves and per-head views, each on its own timer while a run trains -------
job = live.current_job()
if job is not None:  # the run's command in the page's words (the kept paths in the tooltip); fixed while it trains
    shown_command(job.cfg)
live.show(
    live.Watch(
        loaded=loaded,
        source=ui.job_source(st.session_state[ui.MODEL_KEY]),
        specs=tuple(str(s) for s in specs),
        heads=heads_spec,
        alpha=alpha,
        seed=int(seed),
        layer=layer,
        head=head,
        text=text_cfg,
    )
)
job = live.current_job()
if job is not None and job.snapshot().done:
    snap = job.snapshot()
    ui.export_all(
        live.shown_plots(job),
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

"""Sweeps: regularizers x lambdas x seeds retrains of one model on Ray (a local Ray, or the cluster
named by RAY_ADDRESS), launched in a background thread that never calls Streamlit; the trials
arrive live in a table and a Pareto scatter (accuracy vs data or vocabulary entropy), and any
trial opens as the model of every other page."""

import math
import os
import threading

import numpy as np
import pandas as pd
import streamlit as st

import ui
from attn_core import regularizers as R
from attn_core import runs as rs
from attn_core import sources
from attn_core.figures import sweep as fs
from attn_core.sweep import SweepError, grid_plan, run_sweep, start_sweep, sweep_result
from attn_core.sweep import line as sweep_line
from attn_core.training.config import JobConfig
from attn_core.training.queue import JobQueue
from ui import queue_view

REFRESH_S = 2.0
LAUNCHED = "sweeps_launched"  # session key: {sweep id: {"thread": Thread, "error": str | None}}
PICKED = "sweeps_picked"  # session key: the sweep shown
TRIAL_STEPS, TRIAL_MAX_STEPS = 100, 20_000  # a trial's steps on this page: its default and most

loaded = ui.setup("Sweeps")  # the sidebar's model (or ?model=): the model every page uses is the one swept
store = rs.RunStore()
queue = queue_view.keep() or JobQueue()  # the server's job queue: every sweep waits its turn there
launched: dict = st.session_state.setdefault(LAUNCHED, {})
picked_model = st.session_state[ui.MODEL_KEY]


def lambdas(lo: float, hi: float, n: int) -> list[float]:
    """``n`` lambdas from ``lo`` to ``hi``, evenly spaced on a log scale (rounded to 3 digits)."""
    if n == 1 or lo == hi:
        return [float(f"{lo:.3g}")]
    return sorted({float(f"{v:.3g}") for v in np.geomspace(lo, hi, n)})


def _work(sweep_id: str, state: dict, cpus: float, ticket: int, entry: int) -> None:
    """The background thread: the whole sweep (no Streamlit here), from its ``entry`` in the
    server's job queue and its place in the line of this server's sweeps (``ticket``); errors are
    kept for the page. The server keeps the Ray it starts until it ends: Ray shut down under the
    server's other threads could end the server."""
    try:
        kw = dict(sweep_id=sweep_id, cpus_per_trial=cpus, ticket=ticket, keep_ray=True, queue=queue, entry=entry)
        run_sweep(None, rs.RunStore(store.root), **kw)
    except BaseException as e:  # noqa: BLE001 -- shown on the page, never raised into Streamlit
        state["error"] = f"{type(e).__name__}: {e}" if not isinstance(e, SweepError) else str(e)


# --- setting up a sweep -------------------------------------------------------------------------
def setup_form() -> None:
    """The sweep's grid for the picked model; Launch records the sweep and starts its thread."""
    # Enter in a number field does not launch a sweep (minutes of every core): only the button does
    with st.form("sweep_setup", enter_to_submit=False):
        st.markdown(
            f"Every trial fine-tunes **{ui.plain(picked_model)}**, the model picked in the sidebar (pick another "
            "there): each regularizer × λ × seed, plus a λ = 0 baseline per seed."
        )
        regs = st.multiselect(
            "Regularizers",
            list(R.REGULARIZERS),
            default=["entropy", "hoyer"],
            key="sweep_regs",
            help="; ".join(f"{k}: {v[1]}" for k, v in R.REGULARIZERS.items()),
        )
        c1, c2, c3, c4, c5 = st.columns(5)
        lo = c1.number_input("λ from", min_value=1e-6, value=0.01, format="%g", key="sweep_lo")
        hi = c2.number_input("λ to", min_value=1e-6, value=1.0, format="%g", key="sweep_hi")
        n_lam = c3.number_input("λ values (log-spaced)", min_value=1, max_value=12, value=3, key="sweep_nlam")
        seeds = c4.number_input("Seeds", min_value=1, max_value=10, value=1, key="sweep_seeds")
        # a trial's steps are JobConfig's (the sweep trains retrain runs); the page's sweep is quicker
        # than the CLI's (TRIAL_STEPS a trial) and a server's is bounded (TRIAL_MAX_STEPS: every trial takes them)
        steps = ui.setting_input(
            c5, JobConfig, "steps", "sweep_steps", max_value=TRIAL_MAX_STEPS, value=TRIAL_STEPS, label="Steps per trial"
        )
        cpus = st.number_input(
            "CPUs per trial",
            min_value=0.25,
            value=1.0,
            step=0.25,
            key="sweep_cpus",
            help="Ray runs as many trials at once as the cores allow.",
        )
        where = os.environ.get("RAY_ADDRESS") or f"a local Ray with {os.cpu_count()} CPUs"
        go = st.form_submit_button(
            f"Sweep {picked_model} on {where}", type="primary", icon=":material/rocket_launch:", key="sweep_go"
        )
    if not go:
        return
    try:
        lams = lambdas(min(lo, hi), max(lo, hi), int(n_lam))
        plan = grid_plan(ui.job_source(picked_model), {r: lams for r in regs}, int(seeds), steps=int(steps))
        user = queue_view.who()[0]
        queue.check(user, int(steps))  # a per-user limit refuses before anything is recorded
        sweep_id, _ = start_sweep(plan, store)
        spec = {"sweep_id": sweep_id, "store": str(store.root), "cpus": float(cpus)}
        entry = queue.submit(user=user, kind="sweep", device="cpu", spec=spec, steps=int(steps), target=sweep_id)
    except (SweepError, ValueError) as e:
        st.error(f"The sweep was not started: {e}")
        return
    waits = sweep_line.busy()  # another sweep of this server runs: this one waits for it (Tune runs one at a time)
    ticket = sweep_line.LINE.ticket()  # its place in line now: sweeps run in the order they were launched
    state = {"error": None}
    state["thread"] = threading.Thread(
        target=_work, args=(sweep_id, state, float(cpus), ticket, entry), daemon=True, name=f"attn-lab sweep {sweep_id}"
    )
    try:
        state["thread"].start()
    except RuntimeError as e:  # no thread to be had: the place is given back, the sweep says why
        sweep_line.LINE.release(ticket)
        queue.release(entry, "failed", str(e))
        st.error(f"The sweep was not started: {e}")
        return
    launched[sweep_id] = state
    st.session_state[PICKED] = sweep_id
    st.success(
        f"Sweep {sweep_id} of {picked_model} launched: {len(plan.trials)} trials (a λ = 0 baseline per seed)."
        + (
            " Another sweep of this server is under way: this one waits in line and starts when it ends."
            if waits
            else ""
        )
    )


if loaded.task is None:
    st.warning(
        f"{ui.plain(loaded.name)} has no known task in its card, so no sweep can retrain it: pick another model."
    )
else:
    setup_form()

queue_view.show(queue, "sweep")  # this user's sweeps in the server's queue: place, wait, Cancel

# --- watching one ----------------------------------------------------------------------------------
ui.run_store_panel(store)


def open_run(run_id: str) -> None:
    """Make ``run:<id>`` the model of every page (the shared picker's remembered value)."""
    name = sources.RUN_PREFIX + run_id
    ui.remember(ui.MODEL_KEY, name)
    st.session_state[ui.MODEL_KEY] = name
    st.session_state["sweeps_opened"] = name


def sweep_label(sweeps: list[dict], sweep_id: str) -> str:
    """What never changes about a sweep: its id, model and number of trials. Its status and how
    many trials are recorded are drawn fresh under the selector (a selectbox keeps the labels it
    was first drawn with, so a status in them stayed "running" after the sweep ended)."""
    s = next(s for s in sweeps if s["id"] == sweep_id)
    return f"{s['id']} · {s['name']} · {s['trials']} trials"


def running(sweeps: list[dict]) -> bool:
    """Whether a sweep is still under way: one of this session's threads, or one the store says
    is running (a CLI sweep, another session's)."""
    return any(s["status"] == "running" for s in sweeps) or any(v["thread"].is_alive() for v in launched.values())


try:
    started_with = store.list_sweeps()
except rs.RunStoreError as e:  # a corrupt or unreadable store: one line, the page stays up
    st.error(str(e))
    st.stop()
if not started_with:
    st.info(
        f"No sweeps in {ui.code(store.root)} yet: set one up above, or run "
        f"{ui.code(f'attn-lab sweep {ui.job_source(picked_model)} --grid entropy=0.01,0.1,1 --seeds 2')}."
    )
    st.stop()
live_at_start = running(started_with)


@st.fragment(run_every=REFRESH_S if live_at_start else None)
def live() -> None:
    """The sweep selector, its progress, trials and Pareto scatter, read afresh from the store on
    every refresh (the selector's labels too); when the last sweep under way ends, the whole page
    reruns once so that the refresh timer stops."""
    try:
        sweeps = store.list_sweeps()
    except rs.RunStoreError as e:
        st.error(str(e))
        return
    ids = [s["id"] for s in sweeps]
    if st.session_state.get(PICKED) not in ids:
        st.session_state[PICKED] = ids[0]
    picked = st.selectbox("Sweep", ids, key=PICKED, format_func=lambda i: sweep_label(sweeps, i))
    state = launched.get(picked)
    res = sweep_result(store, picked)
    thread_alive = bool(state and state["thread"].is_alive())
    n_done = sum(t["status"] != "pending" for t in res["trials"])
    queued = res["status"] == "running" and res["message"].startswith("queued:")
    st.progress(
        n_done / len(res["trials"]) if res["trials"] else 0.0,
        text=f"{'queued' if queued else res['status']}"
        f"{' (live)' if res['status'] == 'running' or thread_alive else ''}: {n_done} of "
        f"{len(res['trials'])} trials recorded"
        + (f" · Ray {res['ray_version']} at {res['address']}" if res["ray_version"] else "")
        + (f" · {res['wall_s']:.1f} s" if res["wall_s"] else ""),
    )
    if state and state.get("error"):
        st.error(f"The sweep stopped: {state['error']}")
    elif res["message"]:
        st.caption(res["message"])
    front = set(res["pareto"])
    table = pd.DataFrame(
        [
            {
                "run": t["run_id"],
                "regularizer": t["reg"],
                "λ": t["lambda"],
                "seed": t["seed"],
                "status": t["status"],
                "accuracy": (t["after"] or {}).get("accuracy", math.nan),
                "H data": (t["after"] or {}).get("entropy_data", math.nan),
                "H vocab": (t["after"] or {}).get("entropy_vocab", math.nan),
                "Pareto": t["run_id"] in front,
                "message": t["message"],
            }
            for t in res["trials"]
        ]
    )
    ui.show_table(table, hide_index=True, width="stretch")
    view = st.radio(
        "Entropy",
        list(fs.ENTROPY_VIEWS),
        horizontal=True,
        key="sweep_view",
        format_func=lambda v: {"data": "on data", "vocab": "vocabulary view"}[v],
    )
    ui.show_plot(fs.pareto_plot(res, view), key="sweep_pareto", help=None)
    openable = [t["run_id"] for t in res["trials"] if t["has_weights"]]
    if openable:
        c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
        rid = c1.selectbox(
            "Trial",
            openable,
            key="sweep_open_choice",
            index=openable.index(res["pareto"][0]) if res["pareto"] and res["pareto"][0] in openable else 0,
            format_func=lambda r: next(f"run:{r} · {t['key']}" for t in res["trials"] if t["run_id"] == r),
        )
        c2.button(
            "Open as the model of every page",
            key="sweep_open",
            on_click=open_run,
            args=(rid,),
            icon=":material/open_in_new:",
        )
    if st.session_state.get("sweeps_opened"):
        st.success(f"{st.session_state['sweeps_opened']} is now the model on every page (Heatmaps, Spectrum, ...).")
    if live_at_start and not running(sweeps):
        st.rerun()  # the whole page, once: its timer stops and every label is final


live()

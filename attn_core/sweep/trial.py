"""One trial, on a worker and back on the driver.

:func:`run_trial` is what a Ray worker runs: the trial's :class:`TrainingJob` with ``store=False``
(workers never write SQLite), the same job ``attn-lab retrain`` runs, and returns a *payload*: the
final weights as safetensors bytes, the metric log, before/after, the card and the status. An error
becomes a ``failed`` payload, never an exception, so the sweep goes on. :func:`record_trial` runs on
the driver and writes one payload into the run store as a run of the sweep (the single writer)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import traceback
from collections.abc import Callable, Mapping

from attn_core.card import public
from attn_core.runs.names import in_store
from attn_core.sweep.plan import Trial

# report(step, latest_metrics) during training (ASHA reads it); returns nothing
Report = Callable[[int, dict], None]


def run_trial(
    trial: Mapping,
    job: Mapping | None = None,
    threads: int | None = 1,
    report: Report | None = None,
    report_every: int = 0,
    stop: Callable[[], bool] | None = None,
    store_root: str | None = None,
) -> dict:
    """Train one trial (a dict of :class:`Trial`) with the shared ``job`` settings in this process
    (``threads`` torch threads; None leaves the setting alone) and return its payload.

    With ``report`` and ``report_every`` > 0 the job trains in its worker thread and ``report`` is
    called here about every ``report_every`` steps with the latest metrics; once ``stop()`` is
    true (Tune stops the trial: Ctrl-C on the driver) the job stops after its current step.
    ``store_root``: the sweep's run store, where the trial's model (``run:<id>``, ``upload:``) and
    token caches are read (the trial itself writes nothing there: the driver records it)."""
    import torch

    t = Trial.from_dict(trial)
    if threads:  # the trial's own threads (its share of the CPUs), set here and taken by its trainer
        torch.set_num_threads(int(threads))
    start = time.perf_counter()
    base = {"key": t.key, "trial": t.to_dict(), "parent": t.source, "host": socket.gethostname(), "pid": os.getpid()}
    try:
        from attn_core.retraining.job import TrainingJob

        cfg = t.job_config(job)
        if threads:
            cfg = dataclasses.replace(cfg, threads=int(threads))
        with in_store(store_root):  # its model and text are read from the sweep's store
            j = TrainingJob.open(cfg, store=False)
            j.build()  # the trial trains here: its weights are read now, from that store
        if (report is not None and report_every > 0) or stop is not None:
            j.start()
            next_step = report_every
            while not j.join(0.05):
                if stop is not None and stop():
                    j.stop()
                snap = j.snapshot()
                if report is not None and report_every > 0 and snap.step >= next_step and "task_loss" in snap.latest:
                    report(snap.step, dict(snap.latest))
                    next_step = (snap.step // report_every + 1) * report_every
        else:
            j.run()
        return {**base, **_payload(j), "seconds": time.perf_counter() - start}
    except Exception as e:  # a trial that raises is recorded as failed; the sweep goes on
        tb = traceback.format_exc(limit=3)
        return {
            **base,
            "status": "failed",
            "message": f"{type(e).__name__}: {e}",
            "traceback": tb,
            "seconds": time.perf_counter() - start,
            "weights": None,
        }


def _payload(j) -> dict:
    """What travels back to the driver: weights bytes, the metric log, the card and the measurements."""
    from safetensors.torch import save as st_save

    from attn_core.training.checkpoints import take_files
    from attn_core.training.record import Outcome

    res = j.result()
    steps, names, values = (list(c) for c in j.recorder.columns)
    out = {
        "status": res["status"],
        "message": res["message"],
        "steps": res["steps"],
        "task": j.task.name,
        "config": j.cfg.to_dict(),
        "before": res["before"],
        "after": res["after"],
        "metrics": {"step": steps, "name": names, "value": values},
        "weights": None,
    }
    # a trial on Ray Train workers: its rank 0 sent the card and checkpoint files (none when the run
    # failed before it could: the trial is recorded failed, with Ray's reason, without weights)
    remote = getattr(j, "remote", None)
    if remote is not None and hasattr(remote, "checkpoint_files"):
        if remote.card is None:
            return out
        card, files = remote.card, remote.checkpoint_files
    else:  # the card the retrain job writes for its run (the store gives it the run id when it saves)
        card = j.card(Outcome(res["status"], res["message"]), res["after"]).to_dict()
        files = take_files(getattr(j, "checkpoints", None))
    model = j.model_copy()
    return {
        **out,
        "card": card,
        "model_config": model.cfg.to_dict(),
        "weights": st_save({k: v.contiguous() for k, v in model.state_dict().items()}),
        "checkpoints": files,
    }


def payload_size(payload: Mapping) -> int:
    """Bytes a payload holds: its safetensors weights plus everything else as JSON (roughly what
    crosses the network to the driver)."""
    import json

    rest = {k: v for k, v in payload.items() if k != "weights"}
    rest = {k: v for k, v in rest.items() if k != "checkpoints"}
    files = sum(len(b) for b in (payload.get("checkpoints") or {}).values())
    return len(payload.get("weights") or b"") + files + len(json.dumps(rest, default=str).encode())


def record_trial(store, sweep_id: str, payload: Mapping) -> str:
    """Write one trial's payload as a run of sweep ``sweep_id``; returns the run id."""
    from attn_core.card import Card

    model = None
    card = Card.from_dict(payload.get("card")) if payload.get("card") else None
    if payload.get("weights"):
        from attn_core import checkpoint
        from attn_core.model import ModelConfig

        model = checkpoint.load_bytes(
            payload["weights"], cfg=ModelConfig.from_dict(payload["model_config"]), card=card
        ).model
    m = payload.get("metrics") or {}
    rows = list(zip(m.get("step", ()), m.get("name", ()), m.get("value", ())))
    trial = payload["trial"]
    config = payload.get("config") or {
        "source": trial["source"],
        "seed": trial["seed"],
        "regularizers": Trial.from_dict(trial).spec,
    }
    staging = _stage_checkpoints(store, payload.get("checkpoints"))
    try:
        return _add_run(store, sweep_id, payload, model, card, rows, config, staging, _companions(store, card, payload))
    finally:
        if staging is not None and staging.exists():  # not moved into the run: its save failed
            import shutil

            shutil.rmtree(staging, ignore_errors=True)


def _stage_checkpoints(store, files: Mapping | None):
    """A trial's checkpoint files written into a hidden folder of the store (moved into the run's
    folder when it is saved); None without files. Only plain names are written."""
    if not files:
        return None
    import re
    import tempfile
    from pathlib import Path

    from attn_core.destinations import tmp_prefix

    store.root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=tmp_prefix("checkpoints"), dir=store.root))
    for name, data in files.items():
        if not re.fullmatch(r"(step-\d{9}\.safetensors|index\.json)", str(name)):
            continue  # a payload names files, never paths
        (staging / name).write_bytes(data)
    return staging


def _companions(store, card, payload: Mapping) -> dict[str, bytes] | None:
    """The tokenizer files of a trial of an imported model (its card names the Hugging Face
    folder it came from), read on the driver from the trial's source folder, saved with its run."""
    if card is None or "hf" not in card.details or not payload.get("weights"):
        return None
    from attn_core.hf.family_export import companion_files
    from attn_core.text.source import model_folder

    try:
        return companion_files(model_folder(payload["trial"]["source"], store)) or None
    except (OSError, ValueError):  # the run is kept without them (heatmaps then show token ids)
        return None


def _add_run(store, sweep_id: str, payload: Mapping, model, card, rows, config, staging, files=None) -> str:
    from attn_core.checkpoint import CHECKPOINTS

    return store.add_run(
        files=files,
        include={CHECKPOINTS: staging} if staging is not None else None,
        parent=payload.get("parent"),
        task=payload.get("task"),
        config=config,
        status=payload["status"],
        message=payload.get("message", ""),
        model=model,
        card=card,
        summary={
            "before": public(payload.get("before")),
            "after": public(payload.get("after")),
            **({"interrupted": True} if payload.get("interrupted") else {}),  # a resume runs it again
        },
        metrics=rows,
        sweep=sweep_id,
        trial=payload["key"],
    )

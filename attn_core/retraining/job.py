"""The live retraining job: a :class:`TrainingJob` trains in a worker thread (or, for the
dashboard, a worker process: :mod:`attn_core.training.worker`) that never touches Streamlit and
publishes immutable :class:`Snapshot` s (step, losses, metrics, spectra, a probe pattern) under a
lock; the Retrain page and ``attn-lab retrain`` poll them. Stop and pause are events checked
between steps; the step loop and the saving of the run are :mod:`attn_core.training.record`'s;
what is measured and logged is :mod:`attn_core.training.telemetry`'s, on the heads that matter:
telemetry of the regularized heads on the probe batch, the watched head's probe pattern (and no
other: a job nobody watches copies no pattern from the device), the spectra of the watched and
regularized heads, and the before/after measurement sized to the run. Each reads the weights
through ``Trainer.view()`` (the model, or on rank 0 of an FSDP run its gathered weights).
What the job starts from (the parent model, its task, text) is :mod:`attn_core.retraining.parent`'s
(docs/architecture.md, "Live retraining")."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

import torch

from attn_core import regularizers as R
from attn_core.card import Card
from attn_core.device import select_device
from attn_core.model import Transformer
from attn_core.regularizers.penalty import build_penalty
from attn_core.retraining.parent import Parent, Retraining, open_parent, parent_model
from attn_core.runs import RunStore
from attn_core.training import checkpoints, estimate, telemetry, worker
from attn_core.training import queue as Q
from attn_core.training.config import JobConfig
from attn_core.training.record import Outcome, RunRecorder, error_text, measure_final, record_run, run_card
from attn_core.training.slots import SLOTS, JobSlots, started
from attn_core.training.snapshot import Snapshot
from attn_core.training.trainer import EVAL_SEED_OFFSET, Trainer

# the snapshot fields read from the job's state as they are
SNAPSHOT_STATE = ("status", "message", "step", "elapsed_s", "train_s", "step_s", "before", "after")
SNAPSHOT_STATE += ("probe_pattern", "probe_step", "probe_head", "probe_tokens", "workers", "compile_s", "left_s")
PAUSED_POLL_S = 0.1  # a paused job looks for a newly watched head this often


def spectra_values(model, heads) -> dict:
    """A spectra refresh's row: the spectra of every head's B and, rotary, sigma_1(B(delta)) of
    ``heads`` (the first :data:`telemetry.LIVE_OFFSET_HEADS` of them)."""
    return {**telemetry.spectra_row(R.head_spectra(model)), **telemetry.offsets_row(model, heads)}


class Phases(dict):
    """Seconds a job spent in each part of its run, by name: ``load`` (building the
    job: the model, the task, the probe), ``before`` and ``after`` (the measurements),
    ``telemetry`` and ``spectra`` (the periodic measurements), ``save``;
    :meth:`TrainingJob.phase_seconds` adds the steps, the evaluations among them and compiling."""

    @contextlib.contextmanager
    def timed(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - started


class TrainingJob:
    """A retraining run in a worker thread (or process) that never touches Streamlit.

    Open it, ``TrainingJob.open(cfg)``: the parent is read without its weights
    (:func:`~attn_core.retraining.parent.open_parent`) and handed to the handle, which checks every
    setting against its config, so a bad one fails before anything starts; the model is built once
    where it trains (:meth:`build`). Then ``start()`` it (``process=True``: in a worker process) and
    poll ``snapshot()``; ``pause()``, ``resume()`` and ``stop()`` act between steps. ``run()`` trains in the calling thread. The
    run is saved in the run store (unless ``store=False``): completed, stopped, diverged (the
    last good weights kept) or failed. Two jobs never share state: each loads its own parent.

    ``cfg.workers`` set: ``start()`` and ``run()`` train the job on Ray Train workers
    (:mod:`attn_core.distributed`; this side holds no weights, as with a worker process); ``dist``
    makes this job one rank of such a run (what the workers build)."""

    WORKER = "attn_core.retraining.worker_process"  # the module a worker process runs (training.worker.Remote)

    @classmethod
    def open(cls, cfg: JobConfig, store=None, slots=None, dist=None, user: str = "") -> TrainingJob:
        """The handle of a run of ``cfg``: its parent opened (:func:`open_parent`, without the
        weights; a source or text that cannot be read fails here), then the job. ``store``: the
        run store (None: the default one; False: none, nothing is saved)."""
        started = time.perf_counter()
        store = None if store is False else (store if store is not None else RunStore())
        if store is not None:
            store.check_writable()  # a store that takes no write refuses the job before it trains
        parent = open_parent(cfg, store)
        opened_s = time.perf_counter() - started
        job = cls(cfg, parent, store=store if store is not None else False, slots=slots, dist=dist, user=user)
        job.device  # noqa: B018 -- a device this machine lacks is refused before anything starts
        job.phases["load"] += opened_s
        return job

    def __init__(self, cfg: JobConfig, parent: Parent, store=None, slots=None, dist=None, user: str = ""):
        started = time.perf_counter()
        self.cfg, self.dist = cfg, dist
        # where start() waits its turn: the dashboard's durable queue (a training.queue.JobQueue
        # given), else this process's line (slots.SLOTS: a sweep's trial, a benchmark)
        self.slots: Q.JobQueue | JobSlots = slots if slots is not None else SLOTS
        self.user = user  # the owner, in the queue ("" in single-user mode)
        self._ticket: int | None = None  # the job's entry in the queue (or place in the line)
        self.store = None if store is False else (store if store is not None else RunStore())
        self.retraining = Retraining(cfg, parent)  # --train and --kl
        # the parent without its weights: what this handle reads (the queue's estimate, the
        # snapshot, watch); the loop's model is built once, where it trains (build())
        model_cfg, task, parent_card = parent.config, parent.task, parent.card
        self.parent, self.task, self.parent_card = parent.source, task, parent_card
        self.start_alpha = model_cfg.entmax_alpha  # the parent's, which --kl compares with
        alpha = cfg.entmax_alpha
        self.model_cfg = model_cfg if alpha is None else replace(model_cfg, entmax_alpha=float(alpha))
        self.train_cfg = cfg.train_config(parent_card.train)
        # penalty_rows: the unbiased sampled-rows estimate of the row penalties, drawn under the run's seed
        self.penalty = build_penalty(cfg.specs, self.model_cfg, cfg.heads, rows=cfg.penalty_rows, seed=cfg.seed)
        # a rank trains on the device its worker was given; the driver of workers checks on the CPU
        self._device = dist.device if dist is not None else ("cpu" if cfg.workers else None)
        self._trainer: Trainer | None = None  # the loop's side (build())
        self._build_lock = threading.Lock()
        self.recorder = RunRecorder(self.store)

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._done = threading.Event()  # set once the run has ended and is saved
        self._thread: threading.Thread | None = None
        self._log = self.recorder.columns
        self._state = dict(
            status="pending",
            message="",
            step=0,
            latest={},
            before=None,
            after=None,
            probe_pattern=None,
            probe_step=0,
            probe_head=None,
            probe_tokens=(),  # the probe's first sequence, as token names and ids (the loop draws it: build())
            probe_ids=(),
            trained=None,  # the card's "trained" section (what --train let learn), once the run is recorded
            elapsed_s=0.0,
            train_s=0.0,
            step_s=0.0,
            compile_s=0.0,
            workers=(),
            left_s=None,
        )
        self._t0: float | None = None
        self._t_loop = 0.0
        self.on_publish = None  # called with the job after each publication (a worker's sender)
        self._stop_reason = ""  # why a stop was asked for when it was not the user
        self.remote: worker.Remote | None = None  # the worker process of start(process=True)
        self._watch: tuple[int, int] | None = None  # the head whose probe pattern is shown (watch())
        self._patterns: dict = {}  # patterns of the final weights, computed on request (pattern())
        self._snap: Snapshot | None = None
        self.phases = Phases(load=time.perf_counter() - started)  # seconds of each part of the run

    # --- the loop's side: the model, built once where the job trains -------------------------------
    def build(self) -> Trainer:
        """Build what trains (once, in the thread, process or rank that trains it; a handle that
        starts the job elsewhere builds none of it): the parent's weights, the penalty with what
        ``--train`` and ``--kl`` add, the :class:`Trainer`, the checkpoints and the probe batch on
        the training device."""
        with self._build_lock:
            if self._trainer is None:
                if self.remote is not None:
                    raise RuntimeError(
                        "this job trains elsewhere and has no model here; model_copy() gives its weights"
                    )
                with self.phases.timed("load"):
                    model = R.with_entmax(parent_model(self.cfg, self.store), self.cfg.entmax_alpha)
                    penalty = self.retraining.penalty(model, self.penalty, self.start_alpha)  # --train, --kl
                    recipe = dict(penalty=penalty, max_loss=self.cfg.max_loss, sync_at=self._measured_at)
                    trainer = Trainer(model, self.task, self.train_cfg, **recipe, device=self._device, dist=self.dist)
                    self.retraining.start(penalty, trainer.model)
                    self._checkpoints = checkpoints.for_job(trainer, self.cfg.checkpoint_plan(), self.store)
                    self._probe = self._probe_batch().to(trainer.device)
                    self._trainer = trainer
        return self._trainer

    def _probe_batch(self):
        """The fixed probe batch of telemetry (at most one training batch of held-out sequences,
        drawn under the run's seed); its first sequence's ids and names go into the state."""
        n = min(self.cfg.probe_samples, self.train_cfg.batch_size)
        probe = self.task.sample(n, self.cfg.seed + 2 * EVAL_SEED_OFFSET, split="test")
        ids = probe.tokens[0].tolist()
        self._state.update(probe_ids=tuple(ids), probe_tokens=tuple(self.task.names(ids)))
        return probe

    @property
    def device(self) -> torch.device:
        """Where the loop trains: a rank's own device, the CPU for the driver of workers, else the
        run's setting (``auto``: CUDA when there is one); a device this machine lacks is a ValueError."""
        return select_device(self.train_cfg.device) if self._device is None else torch.device(self._device)

    @property
    def built(self) -> bool:
        """Whether this side has built the model (a job started elsewhere never does)."""
        return self._trainer is not None

    @property
    def trainer(self) -> Trainer:
        return self._trainer if self._trainer is not None else self.build()

    @property
    def model(self) -> Transformer:
        return self.trainer.model

    @property
    def checkpoints(self):
        self.build()
        return self._checkpoints

    def checkpoint_statement(self) -> str | None:
        """What the run's checkpoints will take, in one line (None when it keeps none), worked
        out from the parent's config: said before training, with no model built here."""
        plan = self.cfg.checkpoint_plan()
        return None if plan is None else checkpoints.CheckpointWriter(plan, self.cfg.steps).statement(self.model_cfg)

    @property
    def probe(self):
        self.build()
        return self._probe

    @property
    def run_id(self) -> str | None:
        return self.recorder.run_id

    # --- control (any thread) -------------------------------------------------------------------
    def start(self, process=False, threads: int | None = None, address: str | None = None, keep_ray=False, entry=None):
        """Train in a worker thread, once its line lets it (the dashboard's job queue,
        ``training.queue``, or this process's line, ``slots.SLOTS``): until then its status is
        ``queued`` and its message says its place. A per-user limit of the queue refuses here. ``entry``: the queue entry of a
        job rebuilt after a restart (:meth:`rebuild`), which it waits for instead of a new one.
        With ``process``, train in a worker process (``threads`` torch threads there; None:
        ``cfg.threads``, else chosen for the run: ``device.choose_threads``) that this thread
        follows (:mod:`attn_core.training.worker`); with ``cfg.workers``, on
        Ray Train workers (``address``: the cluster to join; ``keep_ray``: :func:`attn_core.cluster.ray_session`'s keep)."""
        if self._thread is not None or self._state["status"] != "pending":
            raise RuntimeError("this job has already been started; build a new one to train again")
        if self.cfg.workers and self.dist is None:  # Ray Train's workers train it; this side keeps no weights
            from attn_core.distributed.remote import RayRemote

            self.remote = RayRemote(self, address, keep=keep_ray)
        elif process:  # the worker trains it; this side keeps no weights (worker.Remote)
            self.remote = worker.Remote(self, threads)
        spec = dict(process=bool(process), threads=threads, keep_ray=bool(keep_ray), address=address)
        self._ticket = self._enter(entry, spec)  # a per-user limit refuses here
        self._thread = threading.Thread(target=self._run_safely, name=f"attn-lab job {self.parent}", daemon=True)
        self._thread.start()
        started(self)
        return self

    def run(self, address: str | None = None) -> dict:
        """Train in this thread until the run ends (on Ray Train workers with ``cfg.workers``);
        returns :meth:`result`."""
        if self._state["status"] != "pending":
            raise RuntimeError("this job has already been started; build a new one to train again")
        if self.cfg.workers and self.dist is None:  # this thread follows the workers' run
            self.start(address=address).join()
        else:
            self.build()  # a model that cannot be built raises here, before anything is stored
            self._run_safely()
        return self.result()

    def stop(self, reason: str = "") -> None:
        """Stop after the current step; ``reason``: why, when it was not the user (said in its status)."""
        self._stop_reason = reason or self._stop_reason
        self._stop.set()
        self._go.set()
        self._tell("stop", self._stop_reason)

    @property
    def stop_reason(self) -> str:
        return self._stop_reason

    def requests(self) -> list[tuple]:
        """The commands asked for so far (the watched head; a stop, else a pause), for a worker
        that starts after them."""
        out: list[tuple] = [("watch", *self._watch)] if self._watch is not None else []
        if self._stop.is_set():
            return [*out, ("stop", self._stop_reason)]
        return out if self._go.is_set() else [*out, ("pause",)]

    def state(self) -> dict:
        """The job's published state, as a new dict (what a worker sends to the driver)."""
        return dict(self._state)

    def pause(self) -> None:
        self._go.clear()
        self._tell("pause")

    def resume(self) -> None:
        self._go.set()
        self._tell("resume")

    def watch(self, layer: int, head: int) -> None:
        """Show the probe pattern of head ``layer``, ``head`` (the Retrain page calls this with the
        head it draws): from now on telemetry computes that head's pattern, and only it; the
        first comes before the next step, or at once while paused. A job nobody watches (the CLI)
        computes no pattern and copies none from the device."""
        cfg = self.model_cfg
        if not (0 <= int(layer) < cfg.n_layers and 0 <= int(head) < cfg.n_heads):
            raise ValueError(
                f"head L{layer}H{head} is outside this model's {cfg.n_layers} layers x {cfg.n_heads} heads"
            )
        if self._watch != (int(layer), int(head)):
            self._watch = (int(layer), int(head))
            self._tell("watch", int(layer), int(head))

    def pattern(self, layer: int, head: int):
        """The probe pattern [T, T] of head ``layer``, ``head`` (numpy): the latest telemetry's
        when it is that head's; for a run that has ended, computed from its final weights (on
        the CPU, once per head); else None (the next telemetry of a watched head brings it)."""
        snap = self.snapshot()
        found = snap.pattern_of(layer, head)
        if found is not None or not snap.done:
            return found
        key = (int(layer), int(head), snap.step)
        if key not in self._patterns:
            if not self._state["probe_ids"]:  # the run ended before it drew its probe
                return None
            try:
                model = self.model_copy()
            except RuntimeError:  # a job that ended without weights (failed before training)
                return None
            ids = torch.tensor(self._state["probe_ids"], dtype=torch.long, device="cpu")  # model_copy() is on the CPU
            self._patterns[key] = telemetry.probe_pattern(model, ids, layer, head)
        return self._patterns[key]

    def phase_seconds(self) -> dict[str, float]:
        """Every part of the run so far, in seconds: its :class:`Phases`, ``steps`` (inside
        ``Trainer.step``), of which ``evaluation`` (held-out evaluations) and ``compile`` (the first
        call of each compiled region). A job in a worker process keeps its own."""
        trainer = self._trainer  # None: nothing trained here (a job in a worker process keeps its own)
        return {
            **self.phases,
            "steps": self._state["step_s"],
            "evaluation": trainer.eval_s if trainer is not None else 0.0,
            "compile": trainer.graph.compile_s if trainer is not None else 0.0,
        }

    def _tell(self, *command) -> None:
        if self.remote is not None:  # a job in a worker process: the worker acts on it
            self.remote.tell(*command)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the run to end (and be saved); True when it has. Waits on an event, not on
        ``Thread.join``: a ``KeyboardInterrupt`` inside ``Thread.join`` can mark a live thread as
        finished (Python 3.11), after which the process would exit under a training thread."""
        if self._thread is None and self._state["status"] == "pending":
            return False
        return self._done.wait(timeout)

    @property
    def status(self) -> str:
        return self.snapshot().status

    def snapshot(self) -> Snapshot:
        """The latest published state (a reference swap under a lock: microseconds); before the
        first publication, the pending job's."""
        with self._lock:
            if self._snap is None:
                self._snap = self._state_snapshot()
            return self._snap

    def weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the last good weights (a state dict); of a job in a worker process, the
        weights it sent back when it ended."""
        return self.trainer.good_state_dict() if self.remote is None else self.remote.weights()

    def model_copy(self) -> Transformer:
        """A CPU model with the last good weights, for the page to draw from."""
        m = Transformer(self.model_cfg)
        m.load_state_dict(self.weights())
        return m.eval()

    def result(self) -> dict:
        s = self.snapshot()
        return {
            "run_id": s.run_id,
            "status": s.status,
            "message": s.message,
            "steps": s.step,
            "before": s.before,
            "after": s.after,
            "steps_per_s": s.steps_per_s,
            "compile_s": s.compile_s,
        }

    # --- the worker ---------------------------------------------------------------------------------
    def publish(self, **changes) -> None:
        """Update the job's state with ``changes`` and publish it as the new :meth:`snapshot`."""
        st = self._state
        st.update(changes)
        if self._t0 is not None:
            st["elapsed_s"] = time.perf_counter() - self._t0
        snap = self._state_snapshot()
        with self._lock:
            self._snap = snap
        if self.on_publish is not None:
            self.on_publish(self)

    def _state_snapshot(self) -> Snapshot:
        st = self._state
        return Snapshot(
            **{k: st[k] for k in SNAPSHOT_STATE},
            steps=self.cfg.steps,
            run_id=self.run_id,
            latest=dict(st["latest"]),
            regularized_heads=tuple(self._head_names()),
            n_layers=self.model_cfg.n_layers,
            n_heads=self.model_cfg.n_heads,
            _log=self._log,
            _n=len(self._log[0]),
        )

    def _head_names(self) -> list[str]:
        return [R.head_label(l, h) for l, h in self.penalty.regularized_heads]

    def _record(self, step: int, values: dict) -> None:
        self.recorder.log(step, values)
        self._state["latest"].update(values)

    # --- what the job measures, on the heads that matter ----------------------------------------------
    def _telemetry(self, step: int) -> None:
        """Per-head telemetry of the regularized heads at ``step``, then the watched head's pattern."""
        with self.phases.timed("telemetry"), self.trainer.view() as model:
            row = telemetry.telemetry_row(model, self.probe.tokens, self.penalty.regularized_heads, self.cfg.precision)
            self._record(step, row)
        self._watched_pattern(step)

    def _watched_pattern(self, step: int) -> None:
        """The watched head's probe pattern with the weights of ``step`` (nothing when unwatched)."""
        if self._watch is not None:
            with self.trainer.view() as model:
                pattern = telemetry.probe_pattern(model, self.probe.tokens[0], *self._watch)
            self._state.update(probe_pattern=pattern, probe_step=step, probe_head=self._watch)

    def _spectra(self, step: int) -> None:
        """:func:`spectra_values` of the heads that matter (the watched one first)."""
        heads = ([self._watch] if self._watch is not None else []) + list(self.penalty.regularized_heads)
        with self.phases.timed("spectra"), self.trainer.view() as model:
            self._record(step, spectra_values(model, heads))

    def _measure(self) -> dict:
        """The before/after measurement (``telemetry.measure_run``), on text sized by the run's tokens."""
        with self.phases.timed("before" if self._state["before"] is None else "after"), self.trainer.view() as model:
            return telemetry.measure_run(
                model,
                self.task,
                self.penalty.regularized_heads,
                self.cfg.measure_samples,
                self.cfg.seed,
                tokens=telemetry.measure_tokens(self.train_cfg, self.task),
                precision=self.cfg.precision,
            )

    def _run_safely(self) -> None:
        if self._ticket is None:
            return self._train()
        self._run_queued()

    # --- in the queue: its entry, its wait, its limits while it trains, its outcome ----------------------
    def _enter(self, entry: int | None, start: dict) -> int:
        """The job's entry in ``self.slots`` (the server's queue, ``training.queue``, or this
        process's line): ``entry`` (a rebuilt job's), else a new one with what rebuilds it (JSON)
        and its estimated seconds; ``start``: the arguments of ``start()`` it is started with again."""
        if entry is None:
            spec = {"config": self.cfg.to_dict(), "store": str(self.store.root) if self.store else None, **start}
            entry = self.slots.ticket(
                user=self.user,
                kind="retrain",
                device=Q.device_name(self.device),
                spec=spec,
                steps=self.cfg.steps,
                estimate_s=self._estimate_s(),
            )
        if self.slots.ahead(entry):
            self.publish(status="queued", message=self.slots.describe(entry))
        return int(entry)

    def _estimate_s(self) -> float | None:
        """The run's estimated seconds (``training.estimate``): what the queue tells those behind it."""
        try:
            facts = getattr(self.task, "facts", None)
            block = facts["block"] if facts else self.task.seq_len
            e = estimate.run_seconds(self.model_cfg, self.cfg.steps, self.train_cfg.batch_size, block, str(self.device))
            return float(e["total_s"])
        except Exception:  # no estimate: the wait of those behind it is not said
            return None

    def _run_queued(self) -> None:
        """Wait for the job's turn (its status ``queued``, its message its place), train, and write
        its outcome to the queue; stopped or cancelled while it waits, it ends ``stopped`` untrained."""
        outcome = dict(status="failed", message="")
        ticket = self._ticket
        try:
            queued = lambda ahead: self.publish(status="queued", message=self.slots.describe(ticket))  # noqa: E731
            if self.slots.wait(ticket, self._stop.is_set, queued):
                self.slots.watch(ticket, self.stop, self._done.is_set)
                try:
                    self._train() if self.remote is None else self.remote.train()
                finally:
                    self._done.set()
                snap = self.snapshot()
                outcome = dict(status=snap.status, message=snap.message, target=self.run_id)
                return
            why = self._stop_reason or ("stopped while queued" if self._stop.is_set() else "cancelled while queued")
            outcome = dict(status="cancelled", message=f"{why}; nothing was trained or saved")
            self.publish(status="stopped", message=outcome["message"])
            self._done.set()
        finally:
            self.slots.release(ticket, **outcome)

    @classmethod
    def rebuild(cls, queue: Q.JobQueue, entry: dict) -> TrainingJob:
        """The job of a waiting entry whose server is gone, rebuilt from its spec and started here:
        it waits for that entry and trains when its turn comes."""
        spec = entry["spec"]
        store = RunStore(spec["store"]) if spec.get("store") else False
        job = cls.open(JobConfig(**spec["config"]), store=store, slots=queue, user=entry["user"])
        keep = dict(threads=spec.get("threads"), address=spec.get("address"), keep_ray=spec.get("keep_ray", False))
        return job.start(process=spec.get("process", False), entry=entry["id"], **keep)

    def _train(self) -> None:
        self._t0 = time.perf_counter()
        outcome = Outcome("failed", "")
        interrupted = None
        try:
            self.build()
            self.recorder.start(self.parent, self.task.name, self.cfg.to_dict())
            self.publish(status="running", before=self._measure())
            outcome = self._loop()
        except KeyboardInterrupt as e:  # run() in the main thread without sigint_stops: keep the run
            interrupted = e
            outcome = Outcome("stopped", f"interrupted at step {self._step()} of {self.cfg.steps}")
        except Exception as e:  # an error inside training: the run fails with its reason
            unstarted = self._trainer is None or (self.store is not None and self.run_id is None)
            where = "could not start" if unstarted else f"failed at step {self._step() + 1}"
            outcome = Outcome("failed", f"{where}: {error_text(e)}")
        try:
            self._finish(outcome)
        finally:
            self._done.set()
        if interrupted is not None:
            raise interrupted

    def _step(self) -> int:
        return self._trainer.step_index if self._trainer is not None else 0

    def _interrupt(self) -> str | None:
        """Between steps: wait while paused (pauses do not count as training time); a stop ends the run."""
        step = self.trainer.step_index
        if self._watch is not None and self._state["probe_head"] != self._watch:  # another head is watched
            self._watched_pattern(step)
            self.publish()
        if not self._go.is_set():
            self.trainer.sync()  # the steps run so far are shown while paused
            self.publish(status="paused", message=f"paused at step {step}", train_s=self._state["train_s"])
            paused_at = time.perf_counter()
            while not self._go.wait(PAUSED_POLL_S):
                if self._watch is not None and self._state["probe_head"] != self._watch:
                    self._watched_pattern(step)  # a head picked while paused is shown at once
                    self.publish()
            self._t_loop += time.perf_counter() - paused_at
            self.publish(status="running", message="")
        if self._stop.is_set():
            why = f" ({self._stop_reason})" if self._stop_reason else ""
            return f"stopped at step {self.trainer.step_index} of {self.cfg.steps}{why}"
        return None

    def _measured_at(self, step: int) -> bool:
        """Telemetry and spectrum steps are sync points of the trainer: their rows arrive while
        the model still has that step's weights."""
        return step % self.cfg.telemetry_every == 0 or step % self.cfg.spectrum_every == 0

    def _on_step(self, step: int, row: dict, seconds: float) -> None:
        cfg = self.cfg
        self._state["step_s"] += seconds
        self._state["latest"].update(row)
        if step != self.trainer.step_index:  # an earlier step of a window read at once: logged only
            return
        if step % cfg.telemetry_every == 0 or step == cfg.steps:
            self._telemetry(step)
        if step % cfg.spectrum_every == 0 or step == cfg.steps:
            self._spectra(step)
        train_s = time.perf_counter() - self._t_loop
        self._pace.add(step, train_s - self.trainer.graph.compile_s)
        self.publish(step=step, train_s=train_s, compile_s=self.trainer.graph.compile_s, left_s=self._pace.left())

    def _loop(self) -> Outcome:
        if self.checkpoints is not None:  # step 0, into the run's folder (a temporary one without a store)
            files = self.retraining.files  # a text run's tokenizer: its checkpoints can be measured on text at once
            with self.trainer.view() as model:  # the model, or on rank 0 of an FSDP run its gathered weights
                self.checkpoints.start(checkpoints.job_folder(self.store, self.run_id), model, files=files)
        self._t_loop = time.perf_counter()
        self._pace = estimate.Pace(self.cfg.steps, self.phases.get("before", 0.0))  # measuring after as long
        self._telemetry(0)
        self._spectra(0)
        self.publish(train_s=time.perf_counter() - self._t_loop)
        return record_run(self.trainer, self.recorder, on_step=self._on_step, interrupt=self._interrupt)

    def _finish(self, outcome: Outcome) -> None:
        after = None
        try:  # a failed run on workers is saved at once: its workers are being ended
            if self._trainer is not None and (self.dist is None or outcome.status != "failed"):
                outcome, after = measure_final(self.trainer, outcome, self._measure)
        except Exception as e:
            if not outcome.message:
                outcome = Outcome(outcome.status, f"could not measure the final weights: {e}")
        if self.run_id is not None:
            # the final status is published only once the run is in the store
            self.publish(after=after, message=f"{outcome.message}; saving the run")
            card = self.card(outcome, after)
            files = self.retraining.files  # an imported model's tokenizer, saved with the run
            with self.phases.timed("save"):
                model, before = self.model_copy(), self._state["before"]
                outcome = self.recorder.finish(outcome, model, card, before, after, files=files)
        self.publish(status=outcome.status, message=outcome.message, after=after)

    def card(self, outcome: Outcome, after: dict | None) -> Card:
        """The run's card for ``outcome`` (what the store saves; a sweep trial, which has no
        store, sends it back to the driver): :func:`attn_core.training.record.run_card` with what a
        retrain records (its regularizers and how their rows were computed, the heads, the job's
        settings, its checkpoints, the text and imported-model sections)."""
        cfg = self.cfg
        regs = ", ".join(cfg.to_dict()["regularizers"]) or "no regularizer"
        alpha = f", entmax alpha {cfg.entmax_alpha:g}" if cfg.entmax_alpha is not None else ""
        rows = self.penalty.estimate(self.task.n_ctx)  # how the row penalties were computed
        details = self.retraining.details(self.model, self.task)
        self._state["trained"] = details["trained"]  # for the handle, with the final state
        if rows["estimate"] == "sampled":
            alpha += f", row penalties on {rows['rows']} sampled query rows per head"
        return run_card(
            self.run_id,
            self.trainer,
            outcome,
            parent=self.parent,
            description=f"{self.parent} retrained: {regs}{alpha}",
            before=self._state["before"],
            after=after,
            samples=(after or {}).get("samples", cfg.measure_samples),  # the blocks measured (text: by tokens)
            wall_time_s=self._state["elapsed_s"],
            command=cfg.command(),
            regularizers=self.penalty.describe(),
            penalty=rows,
            **({"penalty_paths": dict(self.penalty.paths)} if self.penalty.paths else {}),  # the path each spec took
            regularized_heads=self._head_names(),
            entmax_alpha=self.model_cfg.entmax_alpha,
            job=cfg.to_dict(),
            **({"checkpoints": self.checkpoints.listing()} if self.checkpoints is not None else {}),
            **({"distributed": self.trainer.dist.describe()} if self.trainer.dist is not None else {}),
            **details,
        )


def preview(cfg: JobConfig, model: Transformer | None = None) -> Snapshot:
    """What a job with ``cfg`` logs at step 0, before any update (per-head telemetry on its probe
    batch, spectra, and the probe pattern of every head: [n_layers, n_heads, T, T]), as a pending
    snapshot: the model as it is. Measured on ``model``, the parent's weights as the caller holds
    them (the dashboard's loaded model; None: read from ``cfg.source``), through the job's handle:
    no Trainer, optimizer or store is made, nothing is trained or stored."""
    job = TrainingJob(cfg, open_parent(cfg), store=False)
    model = R.with_entmax(model if model is not None else parent_model(cfg, None), cfg.entmax_alpha)
    tokens = job._probe_batch().tokens.to(next(model.parameters()).device)
    heads = job.penalty.regularized_heads
    job._record(0, telemetry.telemetry_row(model, tokens, heads, cfg.precision))
    job._record(0, spectra_values(model, heads))
    job.publish(probe_pattern=telemetry.probe_patterns(model, tokens[0]))  # every head, once
    return job.snapshot()


Q.register("retrain", TrainingJob.rebuild)  # adopted after a restart

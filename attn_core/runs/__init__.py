"""The run store: every retraining is a run, indexed in SQLite, its weights a model folder.

Layout of the data directory (``$ATTN_LAB_RUNS``, else one per user: the platform's user data
folder, ``~/.local/share/attn-lab/runs`` on Linux; ``names.default_root``)::

    index.sqlite          runs(id, parent, task, status, message, config, summary, created,
                               updated, finished, pid, host, sweep, trial)  metrics(run, step, name, value)
                          sweeps(id, name, status, message, config, info, created, updated,
                                 finished, pid, host)
    <run id>/             model.safetensors, config.json, card.json (a checkpoint.save folder)

Atomicity: the checkpoint folder is written to a hidden temporary sibling and renamed into place
(``checkpoint.save``), and only then is the run's row marked finished, in one SQLite transaction. A
killed process therefore leaves a row in status ``running`` (and perhaps a hidden temporary
folder, named after its process and removed as soon as that process is gone), never a
half-written run; such rows are shown ``failed`` (or with the status their card recorded, if the
folder made it) and written so by the next writer. Listing reads the index only and never writes
(it works on a read-only or full disk); a store that cannot be read or written raises
:class:`RunStoreError`, one line. Shipped zoo files are never written.

The run statuses are listed in one place (:data:`STATUSES`, :data:`FINAL`, in ``names``), and so
is how a run is named where a model is expected (:data:`RUN_PREFIX`);
``attn_core.sources.resolve("run:<id>")`` loads a run's weights.

Split by concern (docs/architecture.md):

- ``names``: where the store lives (``default_root``, ``root_origin``), run ids (``new_run_id``,
  ``check_run_id``, :data:`RUN_PREFIX`) and the run and sweep statuses;
- ``db``: the SQLite index, opened for writing (schema, migrations) or read-only, and
  :class:`RunStoreError`, what any failure of the store becomes (one line);
- ``store``: :class:`RunStore`, the index and checkpoints of runs (writing, reading, reaping);
- ``sweeps``: the sweep table and the :class:`RunStore` methods that group runs into sweeps;
- ``users``: the stores of a server shared by several people (``<store>/users/<id>/``, ``id`` a
  hash of a login), and ``names.scope_roots``, which makes ``default_root`` the acting person's;
- ``migrate``: the ``runs/`` folders of older releases (``legacy_stores``) and copying their runs
  in (``import_store``), never deleting them.
"""

from attn_core.runs.names import (
    ENV_RUNS,
    FINAL,
    RUN_PREFIX,
    STATUSES,
    SWEEP_STATUSES,
    RunStoreError,
    check_run_id,
    default_root,
    new_run_id,
    root_origin,
    run_label,
)
from attn_core.runs.store import INDEX, STALE_TMP_S, RunStore

__all__ = [
    "ENV_RUNS",
    "FINAL",
    "INDEX",
    "RUN_PREFIX",
    "STALE_TMP_S",
    "STATUSES",
    "SWEEP_STATUSES",
    "RunStore",
    "RunStoreError",
    "check_run_id",
    "default_root",
    "new_run_id",
    "root_origin",
    "run_label",
]

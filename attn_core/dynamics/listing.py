"""What the Dynamics page lists and may read: the sources holding a series (:func:`available`:
runs and models with checkpoints, folders of model folders), a stamp that changes when a series'
list of members may have (:func:`stamp`), and the folders a path typed on the page may lead
into (:func:`check_browsable`: the run store, the zoo and ``$ATTN_LAB_MODELS``, the data folder
``$ATTN_LAB_DATA``; nothing else on the server is read)."""

from __future__ import annotations

from pathlib import Path

from attn_core import sources, zoo
from attn_core.checkpoint import CHECKPOINTS, CheckpointError
from attn_core.dynamics import folders
from attn_core.runs import RunStore, default_root
from attn_core.text.files import ENV_DATA, data_root
from attn_core.training import checkpoints as ckpt
from attn_core.training.checkpoint_plan import MAX_CHECKPOINTS


def _plain_name(name: str) -> str:
    return name[len(sources.RUN_PREFIX) :] if sources.is_run(name) else name


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def stamp(names: list[str], store: RunStore | None = None) -> tuple:
    """What changes when a series' list of members may have: the (path, mtime, size) of the
    folders a series of ``names`` is read from and of their index or manifest. Cheap (a few
    stats): a page keys its series on it, so a checkpoint written since is seen."""
    out = []
    for name in names:
        try:
            where = (store or RunStore()).path(_plain_name(name)) if sources.is_run(name) else zoo.locate(name)
        except (CheckpointError, OSError, ValueError):
            out.append((name, None))
            continue
        for p in (
            where,
            where / CHECKPOINTS,
            where / CHECKPOINTS / ckpt.INDEX,
            where / ckpt.INDEX,
            *(where / m for m in folders.MANIFESTS),
        ):
            try:
                st = p.stat()
                out.append((str(p), st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((str(p), None))
    return tuple(out)


def available(store: RunStore | None = None, problems: list[str] | None = None) -> list[dict]:
    """Sources that hold checkpoints, newest runs first, then named models, then folders of model
    folders (one per checkpoint) directly inside the model folders and the data folder: {source,
    label, checkpoints} (a running run included: its checkpoints so far). A folder whose
    checkpoints cannot be listed (a broken index, a link leading out) is left out, never fatal:
    one sentence naming it goes to ``problems`` when a list is given."""
    out = []
    store = store or RunStore()
    try:
        runs = store.list_runs()
    except ValueError:  # an unreadable store: the named models are still listed
        runs = []
    found = [(f"{sources.RUN_PREFIX}{r['id']}", store.path(r["id"]), f"{r['parent']}, {r['status']}, ") for r in runs]
    found += [(m["name"], Path(m["path"]), "") for m in zoo.list_models(problems=[]) if m.get("path")]
    for source, where, about in found:
        folder = where / CHECKPOINTS
        try:
            n = len(ckpt.read_series(folder)) if folder.is_dir() else 0
        except (OSError, CheckpointError) as e:
            if problems is not None:
                problems.append(f"skipped the checkpoints of {source}: {e}")
            continue
        if n:
            out.append({"source": source, "label": f"{source} ({about}{n} checkpoints)", "checkpoints": n})
    return out + _model_folder_series(problems)


def _model_folder_series(problems: list[str] | None) -> list[dict]:
    out = []
    for root in browsable_roots()[1:]:  # the model folders and the data folder, not the run store
        try:
            children = sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []
        except OSError:
            continue
        for where in children:
            if not folders.is_model_folders(where):
                continue
            try:
                n = len(folders.entries(where, MAX_CHECKPOINTS)[0])
            except (OSError, ValueError) as e:
                if problems is not None:
                    problems.append(f"skipped the model folders of {where.name}: {_reason(e)}")
                continue
            if n:
                out.append({"source": str(where), "label": f"{where.name} ({n} model folders)", "checkpoints": n})
    return out


# --- what a page may read ---------------------------------------------------------------------------


def browsable_roots() -> list[Path]:
    """The folders a path typed on a page may lead into: the run store, the zoo and
    ``$ATTN_LAB_MODELS``, and ``$ATTN_LAB_DATA`` (when set)."""
    roots = [default_root(), *zoo.model_dirs()]
    data = data_root()
    return [*roots, data] if data is not None else roots


def check_browsable(text: str) -> str:
    """``text`` (a path typed on a page) when it leads inside :func:`browsable_roots` (links
    followed), as the path it leads to; a ``run:`` source and a model's name are kept as they
    are. One sentence for anything else: nothing outside those folders is read."""
    text = str(text).strip()
    if not text or "\x00" in text:
        raise ValueError("no folder given")
    if sources.is_run(text) or sources.is_upload(text):
        return text
    roots = [r.expanduser().resolve() for r in browsable_roots()]
    if "/" not in text and not text.startswith("~"):  # a name: a model folder in one of the roots
        for root in roots:
            if (root / text).is_dir() and (root / text).resolve().is_relative_to(root):
                return str(root / text)
    where = Path(text).expanduser().resolve()
    if not any(where.is_relative_to(r) for r in roots):
        raise ValueError(
            f"{text} is outside the folders this dashboard reads (the run store, the zoo, ${zoo.ENV_DIRS} and "
            f"${ENV_DATA}); put the series in one of them"
        )
    if not where.exists():
        raise ValueError(f"{text} does not exist")
    return str(where)

"""Where things are written: a destination checked before any work (``check_destination``: never
inside the shipped ``assets/`` or a model folder, where the path leads through its parents' links;
the destination itself never a link), and
the temporary folders of an atomic save (``checkpoint.save``), named after this host and process
so that the left-over of a killed save is known as such and removed once its process is gone.
A write that fails half-way (a full disk, a file size limit) leaves nothing and is one
``OSError`` naming the destination (:func:`write_file`, :func:`write_failed`).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from attn_core.validate import shown

SHIPPED = Path(__file__).resolve().parent.parent / "assets"  # the shipped zoo (assets/models): read-only
WRITE_ZOO = "ATTN_LAB_WRITE_ZOO"  # "1": a maintainer rebuilds the shipped zoo in place
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json")  # beside a config.json: a model folder
TMP_MARK = ".tmp-"  # .<folder>.tmp-<host tag>-<pid>-<random>[-old]: a save in progress (or killed)
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TMP = re.compile(r"\.tmp-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+(?:-old)?$")
_OLD_TMP = re.compile(r"^\.[^.]+\.(?:[a-z0-9_]{8}|old)$")  # mkdtemp's names before TMP_MARK


def check_destination(
    path: str | Path,
    what: str = "--out",
    empty_ok: bool = False,
    outside=(),
    doing: str = "read",
    overwrite: bool = False,
) -> Path:
    """Refuse, before any work and before anything is written, a destination that cannot take new
    output, with the true reason: it exists (with ``empty_ok``, an empty folder is fine), it is a
    link (a dangling one included: a link is never written through), an empty mount point (which a
    save cannot replace), inside the shipped ``assets/`` (:func:`check_not_shipped`) or inside a
    model folder, inside one of the folders ``outside`` (what the command reads: the folders it
    measures; ``doing`` says what is done to them), a parent that is a dangling link, or its nearest existing folder does not take a
    new (hidden, removed at once) folder. Every place check is made where the path leads, its
    parent folders' links followed: a link among the parents cannot lead a write around the
    rule. With ``overwrite``, an existing plain file (never a link, never a folder) may be
    replaced. The one rule of every command that writes (export, --animate, sinks --out ...) and
    of every write of the Python front door (``Plot.save``, ``EditResult.save``). A path the file
    system cannot take (a name too long) is refused in the same words: it cannot be written."""
    path = check_path(path, what)
    try:
        return _check_destination(path, what, empty_ok, outside, doing, overwrite)
    except OSError as e:  # a name too long, a permission denied on a parent: no write can go there
        raise ValueError(f"{what} {shown(str(path), 120)} cannot be written ({e.strerror or e})") from None


def shown_path(path: object) -> str:
    """``path`` for a one-line message: as it is, or quoted (``repr``) when it holds a newline or
    another character that cannot be printed; a very long one cut short."""
    text = str(path)
    return text if text.isprintable() and len(text) <= 300 else shown(text, 300)


def check_path(path: object, what: str = "--out") -> Path:
    """``path`` as a Path when it is a str or a path object naming something (no NUL byte, not empty)."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (a str or a pathlib.Path), got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise ValueError(f"{what} must name a file or folder, got {shown(text, 120)}")
    return Path(text).expanduser()


def _check_destination(path: Path, what: str, empty_ok: bool, outside, doing: str, overwrite: bool) -> Path:
    check_not_shipped(path, what)
    if path.is_symlink():
        target = os.readlink(path)
        state = "which does not exist (a dangling link)" if not path.exists() else "a link is never written through"
        raise ValueError(
            f"{what} {shown_path(path)} is a link to {shown_path(target)}, {state}; give a new path that is not a link"
        )
    where = Path(os.path.realpath(path.absolute()))  # links followed; a loop never raises here
    for folder in outside:
        if where.is_relative_to(Path(os.path.realpath(Path(folder).expanduser().absolute()))):
            raise ValueError(
                f"{what} {shown_path(path)} is inside {shown_path(folder)}, which is being {doing}; choose a path outside it"
            )
    if path.exists() and not (overwrite and path.is_file()):  # a file to replace: written beside, renamed
        if not empty_ok:
            raise ValueError(f"{what} {shown_path(path)} already exists; choose a new path (nothing was overwritten)")
        if not path.is_dir():
            raise ValueError(f"{what} {shown_path(path)} is a file; choose a new folder (nothing was overwritten)")
        if any(path.iterdir()):
            raise ValueError(
                f"{what} {shown_path(path)} already exists and is not empty; choose a new folder (nothing was overwritten)"
            )
        if os.path.ismount(path):
            raise ValueError(
                f"{what} {shown_path(path)} is a mount point, which a save cannot replace; choose a new folder inside it"
            )
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():
            raise ValueError(
                f"{what} {shown_path(path)}: {shown_path(parent)} is a link to {shown_path(os.readlink(parent))}, which leads nowhere (dangling, or a loop)"
            )
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {shown_path(path)}: {shown_path(parent)} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=tmp_prefix(path.name), dir=parent.resolve()))
    except OSError as e:
        raise ValueError(
            f"{what} {shown_path(path)} cannot be written ({e.strerror or e} in {shown_path(parent)})"
        ) from None
    return path


def check_not_shipped(path: str | Path, what: str = "--out") -> None:
    """Refuse a destination inside the shipped ``assets/`` folder (the zoo is read-only: output
    goes to the run store or a folder of the user's) unless ``$ATTN_LAB_WRITE_ZOO`` is 1 (a
    maintainer rebuilding the zoo), and one inside a model folder (links followed)."""
    where = Path(os.path.realpath(Path(path).expanduser()))  # links followed; a loop never raises here
    if where.is_relative_to(SHIPPED) and os.environ.get(WRITE_ZOO) != "1":
        raise ValueError(
            f"{what} {shown_path(path)} is inside the shipped {SHIPPED.name}/ folder ({SHIPPED}), which holds the zoo and is "
            "never written by a command; choose a folder of your own"
        )
    folder = model_folder_of(where)
    if folder is not None and folder != where:
        raise ValueError(
            f"{what} {shown_path(path)} is inside the model folder {shown_path(folder)}; choose a folder outside it"
        )


def model_folder_of(where: Path) -> Path | None:
    """The model folder (a ``config.json`` beside weights) that ``where`` is or lies in, else None."""
    for folder in (where, *where.parents):
        if (folder / "config.json").is_file() and any((folder / name).exists() for name in MODEL_FILES):
            return folder
    return None


def check_store(root: str | Path, what: str = "the run store") -> Path:
    """Refuse a run store (its index, runs and uploads) in or inside a model folder or inside the
    shipped ``assets/``, links followed, before anything of it is created: its index would sit
    among a model's files (and the saved run be refused after the training). Every write to a
    store checks here first (``RunStore.check_writable``, the index's creation)."""
    root = Path(root).expanduser()
    try:
        where = Path(os.path.realpath(root.absolute()))
        folder = model_folder_of(where)
    except OSError as e:  # a name the file system cannot hold
        raise ValueError(f"{what} {shown(str(root), 120)} cannot be written ({e.strerror or e})") from None
    if where.is_relative_to(SHIPPED):
        raise ValueError(
            f"{what} {shown_path(root)} is inside the shipped {SHIPPED.name}/ folder ({SHIPPED}), which holds the zoo; "
            "choose a folder of your own"
        )
    if folder is not None:
        place = "is the model folder" if folder == where else f"is inside the model folder {shown_path(folder)}"
        raise ValueError(
            f"{what} {shown_path(root)} {place}; a run store needs a folder of its own outside any model folder"
        )
    return root


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` of this host exists."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def tmp_owner(path: Path) -> tuple[bool, int] | None:
    """(made on this host, pid) of a temporary save folder of :func:`save`, None for any other name."""
    m = _TMP.search(path.name)
    return None if m is None or not path.name.startswith(".") else (m.group(1) == _HOST, int(m.group(2)))


def remove_stale_tmp(directory: Path, name: str | None = None, max_age_s: float | None = None) -> list[Path]:
    """Remove the temporary save folders in ``directory`` (of folder ``name`` only, if given) whose
    process on this host is gone; with ``max_age_s``, also those older than that (a save on
    another host, or one named by an older version: ``.<name>.<8 characters>``). Nothing else
    is touched. Returns what was removed."""
    removed, now = [], time.time()
    try:
        entries = list(directory.glob(f".{glob.escape(name)}.*" if name else ".*"))
    except OSError:
        return removed
    for p in entries:
        try:
            if not p.is_dir() or p.is_symlink():
                continue
            owner = tmp_owner(p)
            mine_and_dead = owner is not None and owner[0] and not pid_alive(owner[1]) and owner[1] != os.getpid()
            ours = owner is not None or _OLD_TMP.match(p.name) is not None
            too_old = ours and max_age_s is not None and now - p.stat().st_mtime > max_age_s
            if mine_and_dead or too_old:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        except OSError:
            pass
    return removed


def tmp_prefix(name: str) -> str:
    """The prefix of a temporary folder beside ``name``: ``.<name>.tmp-<host tag>-<pid>-``."""
    return f".{name}{TMP_MARK}{_HOST}-{os.getpid()}-"


def write_failed(e: BaseException, dest: str | Path) -> OSError:
    """The one error of a write to ``dest`` that failed: an ``OSError`` with the reason (a full
    disk, a file too large, no permission; a library's own error that carries an OS error, as
    safetensors' "os error 28" does, included) whose filename is the destination, not the
    temporary file the write went to."""
    code = getattr(e, "errno", None)
    if not isinstance(code, int):
        found = re.search(r"os error (\d+)", str(e))
        code = int(found.group(1)) if found else None
    why = os.strerror(code) if code else ((str(e).strip().splitlines() or [type(e).__name__])[0][:160])
    return OSError(code or errno.EIO, f"{why}; nothing was written", str(dest))


def write_file(path: str | Path, data: bytes) -> Path:
    """Write ``data`` as the file ``path`` through a temporary sibling renamed into place: a
    failure leaves neither (:func:`write_failed` says why)."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=tmp_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(name, 0o644)  # mkstemp makes it private; an export is readable like any file
        os.replace(name, path)
    except OSError as e:
        Path(name).unlink(missing_ok=True)
        raise write_failed(e, path) from None
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return path

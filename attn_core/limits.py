"""Limits on the size of work and of files read: every size a user can ask for is checked here
before work starts, and every file named by a user is checked to be a regular file of bounded
size before it is opened for reading.

Memory limits are derived from this machine: :func:`memory_limit` is half of the memory
available now (``MemAvailable`` of ``/proc/meminfo``, else ``os.sysconf``). Counts whose cost is
time (training steps, generated samples, random features, sequence length of a benchmark) have
fixed ceilings (:data:`MAX_STEPS` and the like) well above anything the lab needs, so a typo
(``--steps 1000000000000``) fails at once instead of running for ever. A refusal is a
:class:`LimitError`, one sentence that names the setting and states the limit.
See ``docs/checkpoints.md`` ("Untrusted input and limits").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from attn_core.validate import is_int, shown

MEMORY_FRACTION = 0.5  # of the memory available now
FALLBACK_MEMORY = 4 * 2**30  # when the machine does not say
MAX_STEPS = 10_000_000  # training steps of one run
MAX_SAMPLES = 1_000_000  # generated or held-out sequences of one measurement
MAX_BATCH = 65_536  # sequences per training batch
MAX_BLOCK = 2**20  # tokens per training sequence (the longest block a text run takes)
MAX_FEATURES = 65_536  # random features / landmarks of a kernel method
MAX_SEQUENCE = 65_536  # sequence length of a timing run
MAX_TOKENS_FILE = 4_000_000  # entries of a vocabulary file
MAX_CORPUS_BYTES = 16 * 2**30  # all the files of one text corpus together
TEXT_LIMIT = f"at most {MAX_CORPUS_BYTES // 2**30} GiB in all"  # every --text's help says it: one limit for a text
FLOAT_BYTES = 4


class LimitError(ValueError):
    """A size beyond what this machine allows; the message states the limit."""


def available_memory() -> int:
    """Bytes of memory this process may still take now: ``MemAvailable`` (Linux; else free
    pages, else 4 GiB), cut to what a cap leaves: the cgroup's memory limit less its usage (v1
    or v2, a container's or a systemd unit's) and ``RLIMIT_AS``/``RLIMIT_DATA`` (``ulimit -v``)
    less this process's size. Under a cap, the machine's free memory is not what can be had."""
    have = _mem_available()
    for cap in (_cgroup_headroom(), _rlimit_headroom()):
        if cap is not None:
            have = min(have, max(0, cap))
    return have


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return FALLBACK_MEMORY


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_headroom() -> int | None:
    """The tightest (limit - usage) of this process's memory cgroup (v2 or v1), None when unlimited."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    dirs = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2
            dirs += [
                ("/sys/fs/cgroup" + path, "memory.max", "memory.current"),
                ("/sys/fs/cgroup", "memory.max", "memory.current"),
            ]
        elif "memory" in controllers.split(","):  # v1
            root = "/sys/fs/cgroup/memory"
            dirs += [
                (root + path, "memory.limit_in_bytes", "memory.usage_in_bytes"),
                (root, "memory.limit_in_bytes", "memory.usage_in_bytes"),
            ]
    room = None
    for folder, limit_file, usage_file in dirs:
        limit, usage = _read_int(f"{folder}/{limit_file}"), _read_int(f"{folder}/{usage_file}")
        if limit is None or usage is None or limit >= 2**60:  # v1 writes "no limit" as ~2^63
            continue
        room = limit - usage if room is None else min(room, limit - usage)
    return room


def _rlimit_headroom() -> int | None:
    """What RLIMIT_AS and RLIMIT_DATA leave of this process's address space (None: no limit)."""
    try:
        import resource

        caps = [(resource.RLIMIT_AS, "VmSize:"), (resource.RLIMIT_DATA, "VmData:")]
        sizes = {}
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key = line.split(maxsplit=1)[0] if line.strip() else ""
                if key in ("VmSize:", "VmData:"):
                    sizes[key] = int(line.split()[1]) * 1024
    except (ImportError, OSError, ValueError, IndexError):
        return None
    room = None
    for which, key in caps:
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY and key in sizes:
            room = soft - sizes[key] if room is None else min(room, soft - sizes[key])
    return room


def memory_limit() -> int:
    """The most memory one computation may ask for: :data:`MEMORY_FRACTION` of what is available."""
    return int(available_memory() * MEMORY_FRACTION)


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def not_led_out(path: Path, inside: Path, what: str, place: str) -> None:
    """Refuse ``path`` when it exists and leads out of ``inside`` (a link, or below one): a run's
    folder, a checkpoints/ folder are read where they are, as every file of a model folder is."""
    if os.path.lexists(path) and not real_path(path).is_relative_to(real_path(inside)):
        raise ValueError(f"{what} is a link to {real_path(path)}, outside {place}; it is never followed")


def size_text(n_bytes: float) -> str:
    """``1.5 GiB``, ``12 MiB``, ``300 KiB``, ``12 bytes`` (``4,096 TiB`` beyond a thousand TiB)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            x = n_bytes / scale
            return f"{x:.3g} {unit}" if x < 1000 else f"{x:,.0f} {unit}"
    return f"{int(n_bytes)} bytes"


def check_memory(what: str, n_bytes: float) -> None:
    """Refuse work that needs more than :func:`memory_limit` bytes (``what``: the work, said so
    that "``what`` needs 3 GiB" reads as a sentence)."""
    limit = memory_limit()
    if n_bytes > limit:
        raise LimitError(
            f"{what} needs about {size_text(n_bytes)} of memory; the limit is {size_text(limit)} "
            "(half the memory available now)"
        )


def check_count(name: str, value: object, *, lo: int = 1, hi: int, why: str = "the limit of this lab") -> int:
    """``value`` as an int when it is an integer in ``lo..hi``; else a LimitError (above ``hi``)
    or a ValueError (not an integer, below ``lo``) that states the range. Both bounds are named,
    the low one first (they cannot be given the wrong way round); a range that is no lab limit is
    ``validate.check_int(name, value, lo, hi)``."""
    if not is_int(value) or value < lo:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {shown(value)}")
    if value > hi:
        raise LimitError(
            f"{name} must be at most {hi:,} ({why}), got {shown(value, 30) if value > 10**24 else f'{value:,}'}"
        )
    return int(value)


def check_forward(name: str, n_sequences: object, cfg, length: int | None = None) -> int:
    """``n_sequences`` (the setting ``name``) when it is 1..:data:`MAX_SAMPLES` and a forward pass
    of the model ``cfg`` (a ModelConfig) on that many sequences of ``length`` tokens (default
    its context) fits in :func:`memory_limit`: logits, and per layer the residual stream, the
    MLP and every head's scores and pattern."""
    n = check_count(name, n_sequences, hi=MAX_SAMPLES)
    T = cfg.n_ctx if length is None else length
    per_token = cfg.d_vocab + cfg.n_layers * (2 * cfg.n_heads * T + 8 * cfg.d_model + 2 * cfg.d_mlp)
    check_memory(f"{name} {n} (a forward pass on {n} sequences of {T} tokens)", n * T * per_token * FLOAT_BYTES)
    return n


def check_cpu_threads(name: str, value: object) -> int:
    """A thread count: 1..the CPUs of this machine."""
    return check_count(name, value, hi=cpu_count(), why="the CPUs this process may use")


# --- files ---------------------------------------------------------------------------------------


def real_path(path: str | Path) -> Path:
    """``path`` with every link resolved, never raising for a link loop (``Path.resolve`` raises
    RuntimeError on one before Python 3.13): a loop resolves to a path whose opening then fails
    with its own error (ELOOP), one sentence where it is read."""
    return Path(os.path.realpath(path))


def regular_file_size(path: str | Path, what: str | None = None) -> int:
    """The size of ``path`` when it is a regular file (symlinks followed); a FIFO, a device, a
    socket or a folder is refused without being opened (opening a FIFO blocks, a device reads
    for ever)."""
    what = what or Path(path).name or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} does not exist") from None
    except OSError as e:
        raise OSError(f"{what} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe, a device or a socket)"
        raise ValueError(f"{what} is {kind}; only regular files are read")
    return st.st_size


def read_file(path: str | Path, limit: int, what: str | None = None) -> bytes:
    """The content of the regular file ``path``, refused when it is larger than ``limit`` bytes.

    The file is checked before it is opened, opened without blocking and checked again on the
    open descriptor (it may have been swapped meanwhile); at most ``limit`` bytes are read."""
    what = what or Path(path).name or str(path)
    size = regular_file_size(path, what)
    if size > limit:
        raise LimitError(f"{what} is {size_text(size)}; the limit is {size_text(limit)}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise OSError(f"{what} cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} is not a regular file; only regular files are read")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise LimitError(f"{what} is larger than {size_text(limit)}, the limit")
    return data

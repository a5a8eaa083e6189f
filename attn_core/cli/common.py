"""What every command group shares: the ``--json`` option, printing (:func:`emit`, :func:`table`),
the one-line error path (:func:`fail`, :func:`guarded`) and the input helpers of the head-level
commands. Option defaults are read from the config dataclasses with ``attn_core.validate.default``."""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

FAMILIES_DIR = Path(__file__).resolve().parents[1] / "hf" / "families"


def hf_families(folder: Path = FAMILIES_DIR) -> tuple[str, ...]:
    """The model_type of each Hugging Face family the registry (``attn_core/hf/families/__init__.py``)
    lists, in its order, read from the source as the root help reads the commands' (importing the
    registry loads torch, which no --help does): its ``module.FAMILY`` lines and each module's
    ``FAMILY = Family("model_type", ...)`` (the module's name where that is not a plain string)."""
    registry = (folder / "__init__.py").read_text()
    names = []
    for module in re.findall(r"^\s+(\w+)\.FAMILY,", registry, re.M):
        found = re.search(r'^FAMILY = Family\(\s*"(\w+)"', (folder / f"{module}.py").read_text(), re.M)
        names.append(found.group(1) if found else module)
    return tuple(names)


JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")
NameArg = typer.Argument(
    ...,
    help=f"Zoo model name, path to a model folder, or a local Hugging Face folder ({', '.join(hf_families())}).",
)


# the input of a head-level command (scores, export, attribute): read by input_tokens
TokensOpt = typer.Option(
    None,
    help='Space-separated tokens, e.g. "a b c": names of the task\'s vocabulary; text for a model with a '
    "tokenizer.json (tokenized by it; a piece it does not know is refused); else token ids or vocabulary entries.",
)
SampleSeedOpt = typer.Option(None, help="Use the held-out task sample with this seed.")
RandomSeedOpt = typer.Option(None, help="Use uniform random tokens with this seed.")


def option(config: type, name: str, help: str | None = None, required: bool = False, unset: bool = False) -> Any:
    """The typer option of the setting ``name`` of ``config``, built from its one declaration
    (``attn_core.declarations``): default (none when ``required``, None when ``unset``: the
    command takes it from elsewhere, a preset; a tuple as the comma-separated text the option
    takes), flag, help (``help`` gives a command's own wording), metavar."""
    from attn_core.declarations import declared
    from attn_core.validate import default

    meta = declared(config, name)
    extra = {"metavar": meta["metavar"]} if meta["metavar"] else {}
    value = ... if required else None if unset else default(config, name)
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    return typer.Option(value, meta["flag"], help=help or meta["help"], **extra)


SETTINGS = "settings"  # the parameter of a command that settings_options() fills


def settings_options(
    config: type, names: tuple[str, ...], required: tuple[str, ...] = (), unset: tuple[str, ...] = (), **wording: str
) -> Callable[[Callable], Callable]:
    """A command's options for the settings ``names`` of ``config``, generated from their one
    declaration (:func:`option`; ``wording``: a command's own help of a setting; ``required``: the
    ones the command wants given, without a default; ``unset``: the ones whose default is None, the
    command then taking them from elsewhere). They stand where the command's ``settings``
    parameter stands, and the command receives them together in it, a dict by setting name (a
    comma-separated list or tuple option as its text)."""
    import inspect
    import typing

    hints = typing.get_type_hints(config)

    def cli_type(name: str) -> Any:
        kind = hints[name]
        if "list" in str(kind) or "tuple" in str(kind):
            return str | None  # a list is given as one comma-separated option
        return kind | None if name in unset else kind

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn, eval_str=True)
        generated = [
            inspect.Parameter(
                n,
                inspect.Parameter.KEYWORD_ONLY,
                default=option(config, n, wording.get(n), n in required, n in unset),
                annotation=cli_type(n),
            )
            for n in names
        ]
        params = []
        for p in signature.parameters.values():
            params += generated if p.name == SETTINGS else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)]

        @functools.wraps(fn)
        def command(**kwargs):
            return fn(**{k: v for k, v in kwargs.items() if k not in names}, settings={n: kwargs[n] for n in names})

        command.__signature__ = signature.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def command_line() -> str:
    """The command being run, as a card records it (``attn-lab train --preset ...``)."""
    return "attn-lab " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# --- output --------------------------------------------------------------------------------------


def _clean(obj: Any) -> Any:
    """JSON-safe: tensors/arrays to lists, non-finite floats to null."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def emit(obj: Any, as_json: bool, human: Callable[[Any], str] | None = None) -> None:
    """Print one JSON document (``--json``), else the human form (indented JSON by default)."""
    if as_json:
        typer.echo(json.dumps(_clean(obj)))
    else:
        typer.echo(human(obj) if human else json.dumps(_clean(obj), indent=2))


def table(rows: list[dict], cols: list[str]) -> str:
    """A plain-text table of ``rows`` (dicts) in columns ``cols``; floats with 4 digits."""

    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) if rows else len(c) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(fmt(r.get(c)).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


# --- errors --------------------------------------------------------------------------------------


MAX_MESSAGE = 400  # characters of an error line; longer messages are cut, with a count


def fail(message: str, as_json: bool = False, kind: str = "invalid") -> None:
    """Report an error and exit 2: one line ``error: ...`` on stderr and, with ``--json``, the
    object ``{"error": ..., "kind": ...}`` on stdout, so a script reading stdout learns why."""
    raise typer.Exit(report(message, as_json, kind, 2))


def report(message: str, as_json: bool, kind: str, code: int) -> int:
    """Print an error as :func:`fail` does; returns ``code`` (the exit status to use)."""
    line = " ".join(str(message).split()) or kind  # one line, whatever the message held
    if len(line) > MAX_MESSAGE:
        line = f"{line[:MAX_MESSAGE]}... ({len(line) - MAX_MESSAGE} more characters)"
    if as_json:
        typer.echo(json.dumps({"error": line, "kind": kind}))
    typer.echo(f"error: {line}", err=True)
    return code


def error_kind(e: BaseException) -> str:
    """What kind of error ``e`` is, for the ``kind`` of a JSON error: ``limit`` (a size beyond
    the limits), ``model`` (a model that cannot be read), ``file`` (a file or folder), ``invalid``
    (a bad setting), ``internal`` (anything else: a bug)."""
    from attn_core.checkpoint import CheckpointError
    from attn_core.limits import LimitError

    for cls, kind in ((LimitError, "limit"), (CheckpointError, "model"), (OSError, "file")):
        if isinstance(e, cls):
            return kind
    return "invalid" if isinstance(e, (ValueError, KeyError, TypeError, RecursionError)) else "internal"


def message_of(e: BaseException) -> str:
    """The one-line message of an expected error."""
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, RecursionError):
        return "the input is nested too deeply to read"
    if isinstance(e, OSError) and e.strerror and e.filename:
        return f"{e.filename}: {e.strerror}"
    return str(e) or type(e).__name__


def guarded(fn: Callable) -> Callable:
    """Turn expected errors (bad input, bad files, sizes beyond the limits) into one clear line
    and exit code 2 (and a JSON error object on stdout with ``--json``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError, OSError, RecursionError) as e:
            fail(message_of(e), bool(kwargs.get("as_json")), error_kind(e))
        except RuntimeError as e:  # torch's linear algebra on weights it cannot handle
            if "can't allocate memory" in str(e):  # beyond a cap the estimates did not see
                fail(out_of_memory(e), bool(kwargs.get("as_json")), "limit")
            linalg = getattr(sys.modules.get("torch"), "linalg", None)  # torch's is torch._C._LinAlgError
            if linalg is None or not isinstance(e, linalg.LinAlgError):
                raise
            fail(f"the linear algebra failed on this model's weights ({message_of(e)})", bool(kwargs.get("as_json")))

    return wrapper


def out_of_memory(e: RuntimeError) -> str:
    """The one line of torch's failed allocation (``... you tried to allocate N bytes ...``)."""
    import re

    from attn_core.limits import size_text

    asked = re.search(r"allocate (\d+) bytes", str(e))
    what = f"{size_text(int(asked.group(1)))} " if asked else ""
    return f"not enough memory: an allocation of {what}failed (a memory cap?); use smaller sizes"


def at_least(option: str, value: int, lo: int) -> None:
    """``ValueError("--option must be at least lo, got value")`` when ``value < lo``."""
    if value < lo:
        raise ValueError(f"{option} must be at least {lo}, got {value}")


def check_finite(what: str, *values) -> None:
    """Refuse a result that is not finite (weights so large that the scores overflow float32
    print as null otherwise, and would look like a result)."""
    import torch

    for v in values:
        t = torch.as_tensor(v, dtype=torch.float64) if not isinstance(v, torch.Tensor) else v
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"{what} are not finite (NaN or Inf): the model's weights are too large for float32 "
                "arithmetic, so there is no result to show"
            )


def needs_task(loaded, why: str) -> None:
    """Refuse a model whose card names no known task (``why``: what the task is needed for)."""
    if loaded.task is None:
        raise ValueError(f"model {loaded.name!r} has no known task in its card, so {why}")


# --- the input of head-level commands -------------------------------------------------------------


def input_tokens(loaded, tokens: str | None, sample_seed: int | None, random_seed: int | None) -> list[int]:
    """Typed tokens, a task sample or random tokens (at most one given; default: sample 0 when
    the model has a task, else random tokens with seed 0)."""
    from attn_core import bilinear
    from attn_core.validate import check_seed

    if sum(x is not None for x in (tokens, sample_seed, random_seed)) > 1:
        raise ValueError("give at most one of --tokens, --sample-seed and --random-seed")
    for option, seed in (("--sample-seed", sample_seed), ("--random-seed", random_seed)):
        if seed is not None:
            check_seed(option, seed)
    if tokens is not None:
        return bilinear.input_ids(loaded, tokens)
    if random_seed is not None or (sample_seed is None and loaded.task is None):
        return bilinear.random_tokens(loaded, random_seed or 0)
    return bilinear.sample_tokens(loaded, sample_seed or 0)


def check_head(loaded, layer: int, head: int) -> None:
    """Raise the one-sentence range error unless ``layer``/``head`` exist in the model."""
    from attn_core import bilinear

    bilinear.check_layer(loaded.model, layer)
    bilinear.check_heads(loaded.model, head)

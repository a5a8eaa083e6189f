"""What every command group shares: the ``--json`` option, printing (:func:`emit`, :func:`table`),
the one-line error path (:func:`fail`, :func:`guarded`) and the input helpers of the head-level
commands. Option defaults are read from the config dataclasses with ``attn_core.validate.default``."""

from __future__ import annotations

import functools
import json
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")
NameArg = typer.Argument(
    ...,
    help="Zoo model name, path to a model folder, or a local Hugging Face folder (gpt2, gpt_neox, llama, mistral, qwen2).",
)


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


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def guarded(fn: Callable) -> Callable:
    """Turn expected errors (bad input, bad files) into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            fail(str(msg))

    return wrapper


def at_least(option: str, value: int, lo: int) -> None:
    """``ValueError("--option must be at least lo, got value")`` when ``value < lo``."""
    if value < lo:
        raise ValueError(f"{option} must be at least {lo}, got {value}")


def needs_task(loaded, why: str) -> None:
    """Refuse a model whose card names no known task (``why``: what the task is needed for)."""
    if loaded.task is None:
        raise ValueError(f"model {loaded.name!r} has no known task in its card, so {why}")


# --- the input of head-level commands -------------------------------------------------------------


def input_tokens(loaded, tokens: str | None, sample_seed: int | None, random_seed: int | None) -> list[int]:
    """Typed tokens, a task sample or random tokens (at most one given; default: sample 0 when
    the model has a task, else random tokens with seed 0)."""
    from attn_core import bilinear

    if sum(x is not None for x in (tokens, sample_seed, random_seed)) > 1:
        raise ValueError("give at most one of --tokens, --sample-seed and --random-seed")
    if tokens is not None:
        return bilinear.encode(loaded, tokens)
    if random_seed is not None or (sample_seed is None and loaded.task is None):
        return bilinear.random_tokens(loaded, random_seed or 0)
    return bilinear.sample_tokens(loaded, sample_seed or 0)


def check_head(loaded, layer: int, head: int) -> None:
    """Raise the one-sentence range error unless ``layer``/``head`` exist in the model."""
    from attn_core import bilinear

    bilinear.check_layer(loaded.model, layer)
    bilinear.check_heads(loaded.model, head)

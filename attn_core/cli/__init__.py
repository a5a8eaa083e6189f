"""The ``attn-lab`` command (also ``python -m attn_core``). Every command takes ``--json`` and
then prints exactly one JSON document on stdout; errors go to stderr as one line (with
``--json`` also a JSON object ``{"error": ..., "kind": ...}`` on stdout), exit code 2 for bad
input and 1 for an unexpected error, never a traceback (:func:`main`).

One module per command group, each a ``typer.Typer`` merged into :data:`app` here:
``models`` (zoo, eval, train, presets), ``bilinear`` (spectrum, scores, heads, export),
``rotary`` (offsets, pair),
``circuits`` (circuits, attribute), ``runs`` (retrain, runs, runs show), ``sweep`` (sweep,
sweeps, sweeps show), ``dynamics`` (metrics across checkpoints), ``grow``, ``kernels``
(kernels, kernels-bench) and ``qk`` (compare-qk); ``common`` holds what they share. Every model NAME goes through
``attn_core.sources.resolve``; option defaults whose setting lives in a config dataclass are read
from it (``attn_core.validate.default``)."""

from __future__ import annotations

import os
import sys
import warnings

import click
import typer

from attn_core.cli import bilinear, circuits, dynamics, export, grow, kernels, models, qk, rotary, runs, sweep
from attn_core.cli.common import message_of, report

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="attn-lab: see, measure, regularize and retrain the QK bilinear form of attention.",
)
for group in (
    models,
    bilinear,
    rotary,
    circuits,
    runs,
    sweep,
    dynamics,
    grow,
    kernels,
    qk,
    export,
):  # `attn-lab --help` order
    app.add_typer(group.app)
app.add_typer(runs.runs_app, name="runs")
app.add_typer(sweep.sweeps_app, name="sweeps")


def main(argv: list[str] | None = None) -> None:
    """Run the command line: every error, a usage error or a bug included, ends as one line
    on stderr (and with ``--json`` a JSON error object on stdout), never a traceback (set
    ATTN_LAB_DEBUG=1 to see the traceback of an unexpected error)."""
    args = sys.argv[1:] if argv is None else list(argv)
    warnings.formatwarning = _warning_line
    as_json = "--json" in args
    try:
        code = app(args=args, prog_name="attn-lab", standalone_mode=False)
    except _USAGE_ERRORS as e:  # a bad option, a missing argument, a value of the wrong type
        if type(e).__name__ == "NoArgsIsHelpError":  # `attn-lab` alone: the help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        code = report(_usage_line(e), as_json, "usage", getattr(e, "exit_code", 2))
    except _ABORTS:  # Ctrl-C outside a command that handles it
        code = report("interrupted", as_json, "interrupted", 130)
    except RecursionError as e:
        code = report(message_of(e), as_json, "invalid", 2)
    except MemoryError:
        code = report("out of memory: the input is larger than this machine can hold", as_json, "limit", 1)
    except Exception as e:  # a bug: still one line, and the way to see more
        if os.environ.get("ATTN_LAB_DEBUG"):
            raise
        name = type(e).__name__
        code = report(f"unexpected {name}: {e} (set ATTN_LAB_DEBUG=1 for the traceback)", as_json, "internal", 1)
    sys.exit(code if isinstance(code, int) else 0)


# typer >= 0.20 carries its own copy of click: its exceptions and click's are caught alike
_USAGE_ERRORS = (typer.TyperException, click.ClickException)
_ABORTS = (typer.Abort, click.exceptions.Abort)


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as one line on stderr (``warning: ...``), not Python's two lines with source."""
    return f"warning: {' '.join(str(message).split())}\n"


def _usage_line(e: Exception) -> str:
    ctx = getattr(e, "ctx", None)
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    text = e.format_message() if hasattr(e, "format_message") else str(e)
    return text + hint


if __name__ == "__main__":
    main()

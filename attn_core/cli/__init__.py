"""The ``attn-lab`` command (also ``python -m attn_core``). Every command takes ``--json`` and
then prints exactly one JSON document on stdout; errors go to stderr as one line, exit code 2.

One module per command group, each a ``typer.Typer`` merged into :data:`app` here:
``models`` (zoo, eval, train, presets), ``bilinear`` (spectrum, scores, heads, export),
``rotary`` (offsets, pair),
``circuits`` (circuits, attribute), ``runs`` (retrain, runs, runs show), ``sweep`` (sweep,
sweeps, sweeps show), ``grow``, ``kernels``
(kernels, kernels-bench) and ``qk`` (compare-qk); ``common`` holds what they share. Every model NAME goes through
``attn_core.sources.resolve``; option defaults whose setting lives in a config dataclass are read
from it (``attn_core.validate.default``)."""

from __future__ import annotations

import typer

from attn_core.cli import bilinear, circuits, export, grow, kernels, models, qk, rotary, runs, sweep

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="attn-lab: see, measure, regularize and retrain the QK bilinear form of attention.",
)
for group in (models, bilinear, rotary, circuits, runs, sweep, grow, kernels, qk, export):  # `attn-lab --help` order
    app.add_typer(group.app)
app.add_typer(runs.runs_app, name="runs")
app.add_typer(sweep.sweeps_app, name="sweeps")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

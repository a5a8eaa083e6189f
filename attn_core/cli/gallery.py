"""``gallery``: every figure of every dashboard page and of ``attn-lab export``, for a zoo model
and an imported one, drawn into one folder with an index page (``attn_core.gallery``)."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, emit, guarded

app = typer.Typer()


@app.command("gallery")
@guarded
def gallery_cmd(
    out: Path = typer.Option(..., help="Folder to write (new or empty): index.html, plotly.min.js, png/."),
    quick: bool = typer.Option(False, "--quick", help="Train and sample less (about a minute on a CPU)."),
    model: str = typer.Option("induction-2l", help="A model with a task (a zoo model, a folder, run:<id>)."),
    imported: str | None = typer.Option(
        None, help="A model without a task (a Hugging Face folder; default: a tiny random Llama made here)."
    ),
    png: bool = typer.Option(True, help="Also write the CLI figures as PNG files (needs Chromium)."),
    as_json: bool = JsonOpt,
):
    """Draw every figure of every page and CLI export into one folder with an index page: open its index.html in a browser to look at them all."""
    from attn_core.gallery import build
    from attn_core.progress import Progress

    bar = Progress(15, "gallery", unit="page")  # on stderr, with --json too

    def step(what: str) -> None:
        bar.set(int(what.split("/")[0]) - 1, what.split(": ", 1)[1])

    index, entries = build(out, quick=quick, model=model, imported=imported, png=png, progress=step)
    bar.set(bar.total)
    bar.close()
    pages = sorted({e.page for e in entries})
    emit(
        {"index": str(index), "figures": len(entries), "pages": pages},
        as_json,
        lambda r: f"wrote {r['figures']} figures of {len(r['pages'])} pages to {r['index']}",
    )

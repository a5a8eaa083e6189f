"""``sinks``: attention sinks of every head (Gu et al. 2024; ``attn_core.bilinear.sinks``) on probes,
and the probe options it shares with ``spectrum`` (whose data-space ranks are measured on the same
probes: ``attn_core.text.probes``); the documents are ``attn_core.documents``."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, NameArg, emit, guarded, table
from attn_core.text.corpus import TEXT_LIMIT

app = typer.Typer()

TextOpt = typer.Option(
    None,
    "--text",
    help=f"Cut the probes from this text (a .txt, .jsonl or .parquet file, or a folder of them; {TEXT_LIMIT}), "
    "tokenized by the model folder's tokenizer.json; default: the model's task samples (a model without a task needs it).",
)
FieldOpt = typer.Option(None, "--text-field", help="The text's JSON key or Parquet column (default text).")
SamplesOpt = typer.Option(32, "--samples", help="Probes: text windows or task samples.")
LengthOpt = typer.Option(None, "--length", help="Tokens per probe (default 64, cut to the model's context).")
SeedOpt = typer.Option(0, "--seed", help="Seed of the task samples.")


def _human(r: dict) -> str:
    rows = [
        dict(
            layer=h["layer"],
            head=h["head"],
            sink="yes" if h["sink"] else "",
            sink_keys=" ".join(map(str, h["sink_keys"])),
            strongest=h["strongest"],
            at_key=h["strongest_key"],
            first_token=h["first"],
            **({} if h["learned"] is None else {"learned_sink": h["learned"]}),
        )
        for h in r["heads"]
    ]
    tail = (
        f"sink rate {r['rate']:.1%} ({r['sink_heads']} of {r['n_heads']} heads have a key of importance > {r['eps']:g} "
        f"among the {r['eligible_keys']} keys at least {r['min_queries']} queries see); first token alone "
        f"(Gu et al.): {r['rate_first']:.1%}\ninputs: {r['inputs']}"
    )
    if r["learned_mean"] is not None:
        tail += (
            f"\nlearned sinks: each row puts {r['learned_mean']:.1%} of its mass on its head's sink logit on average "
            "(learned_sink; first_token is token 0's share)"
        )
    return table(rows, list(rows[0])) + "\n" + tail


@app.command("sinks")
@guarded
def sinks_cmd(
    name: str = NameArg,
    text: Path | None = TextOpt,
    text_field: str | None = FieldOpt,
    eps: float = typer.Option(0.3, "--eps", help="A key whose importance exceeds this is a sink (Gu et al.: 0.3)."),
    samples: int = SamplesOpt,
    length: int | None = LengthOpt,
    seed: int = SeedOpt,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Also write the importance figure (.png, .svg, .html or .csv) to this new file: never overwritten, "
        "never inside the shipped zoo, a model folder or the --text folder, never through a link.",
    ),
    as_json: bool = JsonOpt,
):
    """Attention sinks: per head the importance of each key position (the mean attention it
    receives over the queries that see it), the sink heads (a key above --eps) and the sink rate,
    on probes cut from --text or the model's task samples."""
    from attn_core import documents
    from attn_core.bilinear.sinks import check_eps
    from attn_core.cli.text_options import byte_bars
    from attn_core.destinations import check_destination
    from attn_core.figures import EXPORT_FORMATS, ExportError, write_plot
    from attn_core.figures.sinks import importance_plot
    from attn_core.sources import resolve

    check_eps(eps)
    if out is not None:
        fmt = out.suffix.lstrip(".").lower()
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"--out must end in one of .{', .'.join(EXPORT_FORMATS)}, got {str(out)!r}")
        # the output rule of every command (a model folder, the zoo, a link), before any work; never into the text
        check_destination(out, "--out", outside=[text] if text is not None and text.is_dir() else [])
    loaded = resolve(name)
    with byte_bars() as progress:
        found = documents.sinks_document(loaded, text, text_field, eps, samples, length, seed, progress)
    result = dict(name=loaded.name, **found.to_json())
    if out is not None:
        try:
            result["out"] = str(write_plot(importance_plot(found), out, what="--out"))
        except ExportError as e:
            raise ValueError(str(e)) from None
    emit(result, as_json, _human)

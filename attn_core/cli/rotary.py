"""Rotary heads from the command line: ``offsets`` (the singular values of B(delta) of one head
against the offset, with the un-rotated and offset-free spectra) and ``pair`` (the score of one
query token and one key token against their offset)."""

from __future__ import annotations

import typer

from attn_core.cli.common import JsonOpt, NameArg, check_head, emit, guarded, table

app = typer.Typer()
MAX_SPAN = 4096


@app.command("offsets")
@guarded
def offsets_cmd(
    name: str = NameArg,
    layer: int = typer.Option(0, help="Layer l."),
    head: int = typer.Option(0, help="Query head h."),
    span: int = typer.Option(
        None, help=f"Offsets delta = 0, -1, ..., -(span - 1) [default: 64, or the context], at most {MAX_SPAN}."
    ),
    k: int = typer.Option(8, help="Singular values per offset (1..64)."),
    as_json: bool = JsonOpt,
):
    """Singular values of a rotary head's B(delta) = W_Q R(delta) W_K^T / sqrt(d) against the
    offset delta = key position - query position."""
    from attn_core.bilinear import offsets
    from attn_core.sources import resolve
    from attn_core.validate import check_int

    loaded = resolve(name)
    offsets.check_rotary(loaded.model, "offsets")
    check_head(loaded, layer, head)
    span = min(64, loaded.config.n_ctx) if span is None else span
    check_int("span", span, 1, min(MAX_SPAN, loaded.config.n_ctx))
    check_int("k", k, 1, 64)
    frame = offsets.offset_spectrum(loaded.model, layer, head, list(range(0, -span, -1)), k=k)
    reference = offsets.reference_spectra(loaded.model, layer, head, k=k)
    doc = {
        "model": loaded.name,
        "layer": layer,
        "head": head,
        "kv_head": loaded.config.kv_head(head),
        "rotary_dims": loaded.config.rotary_dims,
        "d_head": loaded.config.d_head,
        "by_offset": [
            {"delta": int(d), "singular_values": g.sort_values("index").singular_value.tolist()}
            for d, g in frame.groupby("delta", sort=False)
        ],
        "reference": {
            p: g.sort_values("index").singular_value.tolist() for p, g in reference.groupby("part", sort=False)
        },
    }

    def human(doc):
        rows = [
            {"delta": r["delta"], **{f"sigma_{i + 1}": s for i, s in enumerate(r["singular_values"][:3])}}
            for r in doc["by_offset"]
        ]
        refs = "\n".join(f"{p}: σ = {', '.join(f'{s:.4g}' for s in v)}" for p, v in doc["reference"].items())
        return table(rows, ["delta", *[c for c in ("sigma_1", "sigma_2", "sigma_3") if c in rows[0]]]) + "\n" + refs

    emit(doc, as_json, human)


@app.command("pair")
@guarded
def pair_cmd(
    name: str = NameArg,
    query: str = typer.Option(..., help="The query token (a name, an id, or text of one token)."),
    key: str = typer.Option(..., help="The key token."),
    layer: int = typer.Option(0, help="Layer l."),
    head: int = typer.Option(0, help="Query head h."),
    span: int = typer.Option(
        None, help=f"Offsets delta = 0, -1, ..., -(span - 1) [default: 128, or the context], at most {MAX_SPAN}."
    ),
    as_json: bool = JsonOpt,
):
    """The score f_x(y) = x B(delta) y^T of one query token and one key token (as the layer's
    norm sees their embeddings) against their offset."""
    import torch

    from attn_core import bilinear
    from attn_core.bilinear import offsets
    from attn_core.sources import resolve
    from attn_core.validate import check_int

    loaded = resolve(name)
    offsets.check_rotary(loaded.model, "pair")
    check_head(loaded, layer, head)
    span = min(128, loaded.config.n_ctx) if span is None else span
    check_int("span", span, 1, min(MAX_SPAN, loaded.config.n_ctx))
    ids = [one_token(loaded, query, "query"), one_token(loaded, key, "key")]
    with torch.no_grad():
        x, y = bilinear.vocab_inputs(loaded.model, layer, ids)
    frame = offsets.pair_scores(loaded.model, layer, head, x, y, list(range(0, -span, -1)))
    names = bilinear.token_names(loaded)
    doc = {
        "query": names[ids[0]],
        "key": names[ids[1]],
        "layer": layer,
        "head": head,
        "scores": frame.to_dict("records"),
    }
    emit(doc, as_json, lambda d: table(d["scores"], ["delta", "score"]))


def one_token(loaded, text: str, what: str) -> int:
    """The id of one token typed as a name, an id or text the tokenizer makes one token of."""
    from attn_core import bilinear

    ids = bilinear.input_ids(loaded, text)
    if len(ids) != 1:
        raise ValueError(f"the {what} {text!r} is {len(ids)} tokens; give exactly one")
    return ids[0]

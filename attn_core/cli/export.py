"""Export commands: ``export-hf`` writes a model as a Hugging Face folder (its own family, or GPT-2)
(:mod:`attn_core.hf.export`), for transformers, TransformerLens, BertViz and nnsight; a model
imported from a Hugging Face folder (or a run of one) is written back as its own family
(:mod:`attn_core.hf.family_export`)."""

from __future__ import annotations

import inspect
from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, NameArg, emit, guarded, hf_families

app = typer.Typer()


@app.command("export-hf")
@guarded
def export_hf_cmd(
    name: str = NameArg,
    out: Path = typer.Option(..., help="Folder to write (must not exist, or be empty; nothing is overwritten)."),
    as_json: bool = JsonOpt,
):
    """Write a model as a Hugging Face (transformers) folder: an imported model, or a run retrained
    from one, as its own family (the families below) with its config.json and tokenizer files; a
    zoo model or a run of one (run:<id>) as a GPT-2 folder: config.json, model.safetensors, a
    tokenizer of the task's token names (an imported model's vocab.json) and a README. Models that do not map onto GPT-2 (merged QK, no LayerNorm, entmax) are refused with
    the reason."""
    from attn_core.bilinear import token_names
    from attn_core.hf.export import export_gpt2
    from attn_core.hf.family_export import export_family, hf_origin
    from attn_core.sources import resolve

    loaded = resolve(name)
    origin = hf_origin(loaded)
    if origin is not None:
        summary = export_family(loaded, out, origin)
        emit(
            summary,
            as_json,
            lambda s: (
                f"wrote {s['out']} ({s['model_type']}, {s['n_layer']} layers x {s['n_head']} heads, "
                f"{s['bytes']} bytes, tokenizer files: {', '.join(s['tokenizer_files']) or 'none'})"
            ),
        )
        return
    names = token_names(loaded)  # the task's, an imported model's vocab.json, else the ids
    has_names = names != [str(i) for i in range(len(names))]
    summary = export_gpt2(loaded, out, names if has_names else None, word_tokenizer=loaded.task is not None)
    emit(
        summary,
        as_json,
        lambda s: (
            f"wrote {s['out']} (GPT-2, {s['n_layer']} layers x {s['n_head']} heads, "
            f"{s['bytes']} bytes{', with a tokenizer' if s['tokenizer'] else ''})"
            + "".join(f"\n  {n}" for n in s["notes"])
        ),
    )


export_hf_cmd.__doc__ = f"{inspect.cleandoc(export_hf_cmd.__doc__)}\n\nFamilies: {', '.join(hf_families())}."

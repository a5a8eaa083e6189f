"""A model imported from a Hugging Face folder (or a run of one) written back as a folder of its own
family (``attn-lab export-hf``): any family of ``hf/families/``, with the original
``config.json`` (rotary, grouped-query and window settings as they were), the weights in the
family's names and layout (its slot table joined: the inverse of the load, ``hf/family.py``), the tokenizer files copied, and a README. transformers loads it
with the logits attn-lab computes (tested per family to 1e-4 in fp32).

Where a model comes from is its *origin*: ``{"model_type", "config"}``, read from the folder
itself, or from a run's card (``details["hf"]``), which a retrain of an imported model writes
(:func:`hf_origin`). The tokenizer files travel with the run (:func:`companion_files`).

Some of our parameters have no tensor in a family (Llama's and Mistral's MLP biases, Qwen2's
o_proj bias, every family's unembedding bias: whatever no slot holds): they are zero on import and held at zero by
retraining (:func:`fixed_params`); an export checks that they still are. A tied unembedding
(``tied_embed``: one tensor, which retraining moves as one) is written tied, without ``lm_head``;
an untied one untied (``tie_word_embeddings`` false).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attn_core.checkpoint import CARD, CheckpointError, LoadedModel, read_card, read_model_file
from attn_core.hf import family as layout
from attn_core.hf.export import README, write_folder
from attn_core.hf.families import FAMILIES, REGISTRY
from attn_core.hf.folder import hf_config
from attn_core.hf.load import model_config
from attn_core.hf.tokenizer import MAX_TOKENIZER_BYTES

HF_DETAIL = "hf"  # the card section of a run of an imported model
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)


def _origin(detail) -> dict | None:
    if isinstance(detail, dict) and detail.get("model_type") in FAMILIES and isinstance(detail.get("config"), dict):
        return {"model_type": detail["model_type"], "config": detail["config"]}
    return None


def hf_origin(loaded: LoadedModel) -> dict | None:
    """``{"model_type", "config"}`` of the Hugging Face folder the model came from: the section
    a run's card carries, or its own folder's config.json; None for our own models."""
    return _origin(loaded.card.details.get(HF_DETAIL)) or folder_origin(loaded.path, card=False)


def folder_origin(folder: Path | None, card: bool = True) -> dict | None:
    """:func:`hf_origin` of a model folder without loading the model: its config.json (a
    Hugging Face folder) or, with ``card``, its card.json's section (a run's folder)."""
    if folder is None or not Path(folder).is_dir():
        return None
    raw = hf_config(Path(folder))
    if raw is not None:
        return _origin({"model_type": raw.get("model_type"), "config": raw})
    if card:
        try:
            return _origin(read_card(Path(folder) / CARD).details.get(HF_DETAIL))
        except CheckpointError:
            return None
    return None


def companion_files(folder: Path | None) -> dict[str, bytes]:
    """The tokenizer (and generation) files of a model folder, by name: what a run of an imported
    model keeps beside its weights and an export copies. Each is read inside the folder only,
    a regular file of at most ``MAX_TOKENIZER_BYTES``."""
    if folder is None or not Path(folder).is_dir():
        return {}
    return {
        name: read_model_file(folder, name, MAX_TOKENIZER_BYTES)
        for name in TOKENIZER_FILES
        if (Path(folder) / name).is_file()
    }


def fixed_params(origin: dict | None, cfg) -> set[str]:
    """Our parameters that the origin's family has no tensor for (module doc); empty for our own
    models."""
    if origin is None:
        return set()
    return layout.fixed_params(REGISTRY[origin["model_type"]], cfg, origin["config"])


def _check_matches(loaded: LoadedModel, origin: dict) -> None:
    """The model must still be what the origin's config.json describes (a card is untrusted)."""
    cfg = loaded.config
    try:
        theirs = model_config(origin["config"])
    except (CheckpointError, ValueError, TypeError) as e:
        raise CheckpointError(
            f"the {origin['model_type']} config.json this model came from is not valid: {e}"
        ) from None
    if cfg.entmax_alpha != 1.0:
        raise CheckpointError(
            f"{loaded.name} uses alpha-entmax attention (alpha={cfg.entmax_alpha:g}); "
            f"{origin['model_type']} uses softmax, so it cannot be written back as that family"
        )
    mine, other = cfg.to_dict(), theirs.to_dict()
    # the unembedding is written as the model holds it (a run saved untied exports untied)
    differ = [k for k in mine if k not in ("entmax_alpha", "tied_embed") and mine[k] != other.get(k)]
    if differ:
        raise CheckpointError(
            f"{loaded.name} no longer matches the {origin['model_type']} config it came from ({', '.join(differ[:4])} differ)"
        )


def family_tensors(loaded: LoadedModel, origin: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, config.json) of the origin's family equal to ``loaded``; refuses a model
    that no longer fits its config or whose fixed parameters are not zero."""
    _check_matches(loaded, origin)
    model, kind, raw = loaded.model, origin["model_type"], dict(origin["config"])
    state = dict(model.named_parameters())
    moved = [n for n in sorted(fixed_params(origin, model.cfg)) if bool(state[n].detach().abs().max() > 0)]
    if moved:
        raise CheckpointError(
            f"{loaded.name} has nonzero {', '.join(moved[:3])}, which a {kind} model has no tensor for "
            "(retraining keeps them at zero; these weights were changed elsewhere)"
        )
    fam = REGISTRY[kind]
    tensors = layout.export_tensors(fam, model, raw)
    config = fam.export_config(model.cfg, raw) if fam.export_config else raw
    tied = model.cfg.tied_embed
    config = {**config, "tie_word_embeddings": tied, "torch_dtype": "float32", "dtype": "float32"}
    return {k: v.contiguous() for k, v in tensors.items()}, config


def _readme(loaded: LoadedModel, kind: str, files: list[str]) -> str:
    card = loaded.card
    facts = {"parent": card.parent, "run id": card.run_id, "steps": card.steps, "command": card.command}
    lines = [
        f"# {loaded.name}",
        "",
        f"Exported by `attn-lab export-hf` from `{loaded.name}` as a transformers `{kind}` model with the "
        f"config.json of the model it was imported from, fp32, embeddings {'tied' if loaded.config.tied_embed else 'untied'}. "
        "It computes the logits attn-lab "
        "computes.",
        "",
        *[f"- {k}: {v}" for k, v in facts.items() if v not in (None, "")],
        f"- tokenizer files: {', '.join(files) or 'none'}",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
        'tok = AutoTokenizer.from_pretrained("path/to/this/folder")',
        "```",
        "",
    ]
    return "\n".join(lines)


def export_family(loaded: LoadedModel, out: str | Path, origin: dict) -> dict:
    """Write ``loaded`` as a folder of its origin's family at ``out`` (absent or empty, never
    overwritten); returns a summary. The tokenizer files come from the model's own folder."""
    out = Path(out).expanduser()
    tensors, config = family_tensors(loaded, origin)
    files = companion_files(loaded.path)
    files.pop(README, None)
    tokenizer_names = sorted(files)
    config["attn_lab"] = {"source": loaded.name, "parent": loaded.card.parent}
    files[README] = _readme(loaded, origin["model_type"], tokenizer_names).encode("utf-8")
    write_folder(out, tensors, config, files)
    written = sorted(p.name for p in out.iterdir())
    cfg = loaded.config
    return {
        "name": loaded.name,
        "out": str(out),
        "model_type": origin["model_type"],
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads,
        "d_model": cfg.d_model,
        "vocab_size": cfg.d_vocab,
        "positional": cfg.positional,
        "tokenizer": "tokenizer.json" in tokenizer_names,
        "tokenizer_files": tokenizer_names,
        "notes": [],
        "files": written,
        "bytes": sum((out / f).stat().st_size for f in written),
    }

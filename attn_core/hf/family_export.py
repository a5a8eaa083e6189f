"""A model imported from a Hugging Face folder (or a run of one) written back as a folder of its own
family (``attn-lab export-hf``): GPT-2, GPT-NeoX, Llama, Mistral or Qwen2, with the original
``config.json`` (rotary, grouped-query and window settings as they were), the weights in the
family's names and layout (the inverse of :mod:`attn_core.hf.families` and
:mod:`attn_core.hf.gpt2`), the tokenizer files copied, and a README. transformers loads it
with the logits attn-lab computes (tested per family to 1e-4 in fp32).

Where a model comes from is its *origin*: ``{"model_type", "config"}``, read from the folder
itself, or from a run's card (``details["hf"]``), which a retrain of an imported model writes
(:func:`hf_origin`). The tokenizer files travel with the run (:func:`companion_files`).

Some of our parameters have no tensor in a family (Llama's and Mistral's MLP biases, Qwen2's
o_proj bias, every family's unembedding bias): they are zero on import and held at zero by
retraining (:func:`fixed_params`); an export checks that they still are. The embedding and the
unembedding are written untied (``tie_word_embeddings`` false), since retraining may move them
apart.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attn_core.checkpoint import CARD, CheckpointError, LoadedModel, read_card, read_model_file
from attn_core.hf.config import FAMILIES, LLAMA_LIKE
from attn_core.hf.export import README, gpt2_config, gpt2_tensors, write_folder
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
    kind, raw = origin["model_type"], origin["config"]
    fixed = {"unembed.b_U"}
    if kind in LLAMA_LIKE:
        if not (kind == "llama" and raw.get("mlp_bias")):
            for l in range(cfg.n_layers):
                fixed |= {f"blocks.{l}.mlp.b_{n}" for n in ("gate", "in", "out")}
        if cfg.attn_bias and kind == "qwen2":  # Qwen2 biases q, k and v, not o_proj
            fixed |= {f"blocks.{l}.attn.b_O" for l in range(cfg.n_layers)}
    return fixed


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
    differ = [k for k in mine if k != "entmax_alpha" and mine[k] != other.get(k)]
    if differ:
        raise CheckpointError(
            f"{loaded.name} no longer matches the {origin['model_type']} config it came from ({', '.join(differ[:4])} differ)"
        )


def _rotary_tensors(kind: str, raw: dict, model) -> dict[str, torch.Tensor]:
    """The family's state dict (fp32) from our model: the inverse of ``hf/families.py``."""
    cfg = model.cfg
    sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    h, g, d, dh = cfg.n_heads, cfg.kv_heads, cfg.d_model, cfg.d_head

    def linear(W: torch.Tensor) -> torch.Tensor:  # per-head row-vector [n, d, dh] -> Linear [n dh, d]
        return W.transpose(1, 2).reshape(-1, W.shape[1])

    if kind == "gpt_neox":
        p = "gpt_neox."
        out = {p + "embed_in.weight": sd["embed.W_E"]}
        for l in range(cfg.n_layers):
            s, q = f"{p}layers.{l}.", f"blocks.{l}."
            qkv = torch.stack([sd[q + f"attn.W_{x}"].transpose(1, 2) for x in "QKV"], dim=1)  # [h, 3, dh, d]
            out[s + "attention.query_key_value.weight"] = qkv.reshape(3 * h * dh, d)
            out[s + "attention.dense.weight"] = sd[q + "attn.W_O"].reshape(h * dh, d).T
            if cfg.attn_bias:
                out[s + "attention.query_key_value.bias"] = torch.stack(
                    [sd[q + f"attn.b_{x}"] for x in "QKV"], dim=1
                ).reshape(-1)
                out[s + "attention.dense.bias"] = sd[q + "attn.b_O"]
            for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
                out[s + theirs + ".weight"], out[s + theirs + ".bias"] = sd[q + ours + ".w"], sd[q + ours + ".b"]
            out[s + "mlp.dense_h_to_4h.weight"], out[s + "mlp.dense_h_to_4h.bias"] = (
                sd[q + "mlp.W_in"].T,
                sd[q + "mlp.b_in"],
            )
            out[s + "mlp.dense_4h_to_h.weight"] = sd[q + "mlp.W_out"].T
            out[s + "mlp.dense_4h_to_h.bias"] = sd[q + "mlp.b_out"]
        out[p + "final_layer_norm.weight"], out[p + "final_layer_norm.bias"] = sd["ln_final.w"], sd["ln_final.b"]
        out["embed_out.weight"] = sd["unembed.W_U"].T
        return out
    p = "model."
    mlp_bias = kind == "llama" and bool(raw.get("mlp_bias"))
    out = {p + "embed_tokens.weight": sd["embed.W_E"]}
    for l in range(cfg.n_layers):
        s, q = f"{p}layers.{l}.", f"blocks.{l}."
        a = s + "self_attn."
        out[a + "q_proj.weight"] = linear(sd[q + "attn.W_Q"])
        out[a + "k_proj.weight"] = linear(sd[q + "attn.W_K"])
        out[a + "v_proj.weight"] = linear(sd[q + "attn.W_V"])
        out[a + "o_proj.weight"] = sd[q + "attn.W_O"].reshape(h * dh, d).T
        if cfg.attn_bias:
            out[a + "q_proj.bias"] = sd[q + "attn.b_Q"].reshape(h * dh)
            out[a + "k_proj.bias"] = sd[q + "attn.b_K"].reshape(g * dh)
            out[a + "v_proj.bias"] = sd[q + "attn.b_V"].reshape(g * dh)
            if kind == "llama":
                out[a + "o_proj.bias"] = sd[q + "attn.b_O"]
        out[s + "input_layernorm.weight"] = sd[q + "ln1.w"]
        out[s + "post_attention_layernorm.weight"] = sd[q + "ln2.w"]
        for ours, theirs in (("gate", "gate_proj"), ("in", "up_proj"), ("out", "down_proj")):
            out[f"{s}mlp.{theirs}.weight"] = sd[f"{q}mlp.W_{ours}"].T
            if mlp_bias:
                out[f"{s}mlp.{theirs}.bias"] = sd[f"{q}mlp.b_{ours}"]
    out[p + "norm.weight"] = sd["ln_final.w"]
    out["lm_head.weight"] = sd["unembed.W_U"].T
    return out


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
    if kind == "gpt2":
        tensors, _ = gpt2_tensors(model)
        config = {**raw, **gpt2_config(model.cfg)}
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key in raw:
                config[key] = raw[key]
    else:
        tensors = _rotary_tensors(kind, raw, model)
        config = raw
    config = {**config, "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32"}
    return {k: v.contiguous() for k, v in tensors.items()}, config


def _readme(loaded: LoadedModel, kind: str, files: list[str]) -> str:
    card = loaded.card
    facts = {"parent": card.parent, "run id": card.run_id, "steps": card.steps, "command": card.command}
    lines = [
        f"# {loaded.name}",
        "",
        f"Exported by `attn-lab export-hf` from `{loaded.name}` as a transformers `{kind}` model with the "
        "config.json of the model it was imported from, fp32, embeddings untied. It computes the logits attn-lab "
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

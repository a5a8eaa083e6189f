"""Export one of our models as a Hugging Face GPT-2 folder (``attn-lab export-hf``), so that it
opens in transformers (``GPT2LMHeadModel.from_pretrained``), TransformerLens, BertViz or nnsight.

The folder holds ``config.json`` (``model_type`` gpt2), ``model.safetensors`` (written with the
safetensors library, names as ``GPT2LMHeadModel.save_pretrained`` writes them), a tokenizer when
the model has token names (``vocab.json``, a word-level ``tokenizer.json`` and
``tokenizer_config.json``) and a ``README.md`` saying where it came from. ``transformers`` is
not needed to export; the tensor layout is the inverse of the importer's
(:mod:`attn_core.hf.gpt2`), so ``load_hf`` reads an export back to the same scores and logits.

What maps exactly onto GPT-2 (pre-LayerNorm, learned positions, one query/key/value width
``d_head = d_model / n_heads``, biases everywhere, a bias-free tied-or-untied ``lm_head``):

- missing attention biases are zeros; ``positional = "none"`` is an all-zero ``wpe``;
- an attention-only model (``d_mlp = 0``) gets MLPs of zeros, and an MLP narrower than
  ``4 d_model`` is padded with zero units: ``gelu(0 + 0) 0 + 0 = 0``, so they add nothing, and
  the width stays GPT-2's default ``4 d_model``, which TransformerLens assumes;
- a head narrower than ``d_head`` (grown heads) is padded with zero query/key columns and its
  scale ``1/sqrt(d_qk)`` is folded into W_Q, b_Q (GPT-2 divides by ``sqrt(d_head)``);
- the unembedding bias ``b_U`` (GPT-2's ``lm_head`` has none) is folded into the final
  LayerNorm's bias: with ``c W_U = b_U``, ``(ln_f(x) + c) W_U = ln_f(x) W_U + b_U``. That needs
  ``b_U`` in the row space of W_U (always so when d_vocab <= d_model and W_U has full rank);
  otherwise the export is refused.

Refused, with the reason: merged QK heads, no LayerNorm, alpha-entmax attention,
``n_heads d_head != d_model`` and heads wider than ``d_head``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from attn_core.checkpoint import CONFIG, WEIGHTS, CheckpointError, LoadedModel
from attn_core.destinations import check_destination, tmp_prefix, write_failed
from attn_core.hf.tokenizer import VOCAB
from attn_core.model import ModelConfig

TOKENIZER, TOKENIZER_CONFIG, README = "tokenizer.json", "tokenizer_config.json", "README.md"
ACT_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_new"}  # ours -> transformers' activation_function
FOLD_TOL = 1e-5  # the largest logit change the b_U fold may make (fp32 rounding), relative to max(1, max|b_U|)


def gpt2_problem(cfg: ModelConfig) -> str | None:
    """Why a model of ``cfg`` does not map onto GPT-2 (one sentence), or None when it does
    (the weights may still refuse: see :func:`gpt2_tensors`)."""
    if cfg.qk == "merged":
        return "its heads store a merged W_QK (d_model x d_model); GPT-2 needs factored W_Q, W_K of width d_head"
    if cfg.normalization != "layernorm":
        return "it has no LayerNorm; GPT-2 applies a LayerNorm before every attention, MLP and the unembedding"
    if cfg.n_experts:
        return f"its MLPs are mixtures of {cfg.n_experts} experts (n_experts); GPT-2's MLP is one dense layer"
    if cfg.entmax_alpha != 1.0:
        return f"its attention is alpha-entmax (alpha={cfg.entmax_alpha:g}); GPT-2 uses softmax"
    if cfg.n_heads * cfg.d_head != cfg.d_model:
        return (
            f"n_heads x d_head = {cfg.n_heads} x {cfg.d_head} differs from d_model {cfg.d_model}; "
            "GPT-2 splits d_model evenly into its heads"
        )
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            w = cfg.head_d_qk(layer, head)
            if w > cfg.d_head:
                return f"head L{layer}H{head} has query/key width {w} > d_head {cfg.d_head}; GPT-2's width is d_head"
    return None


def gpt2_config(cfg: ModelConfig) -> dict:
    """The transformers ``config.json`` of a GPT-2 equal to a model of ``cfg``."""
    d_mlp = max(cfg.d_mlp, 4 * cfg.d_model)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.d_vocab,
        "n_positions": cfg.n_ctx,
        "n_ctx": cfg.n_ctx,  # the old spelling, still read by some tools
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": None if d_mlp == 4 * cfg.d_model else d_mlp,
        "activation_function": ACT_NAMES[cfg.mlp_act],
        "layer_norm_epsilon": cfg.ln_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": "float32",
    }


def _pad(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` with zeros appended along ``dim`` up to ``size``."""
    shape = list(t.shape)
    shape[dim] = size - t.shape[dim]
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _bias(sd: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A bias of the state dict, zeros when the model has none (``attn_bias = False``)."""
    return sd[name] if name in sd else torch.zeros(shape)


def fold_unembed_bias(W_U: torch.Tensor, b_U: torch.Tensor, ln_b: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(ln_b + c, error) with c W_U = b_U (the least-norm c): the final LayerNorm's bias that
    carries b_U, and the largest change of a logit it makes, as stored in fp32."""
    c = torch.linalg.pinv(W_U.double().T) @ b_U.double()  # solves W_U^T c = b_U when it can be solved
    folded = (ln_b.double() + c).float()
    error = float(((folded.double() - ln_b.double()) @ W_U.double() - b_U.double()).abs().max())
    return folded, error


def gpt2_tensors(model) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The ``GPT2LMHeadModel`` state dict (fp32) equal to ``model`` (our Transformer) and notes
    on what was adapted; raises :class:`CheckpointError` when it does not map."""
    cfg: ModelConfig = model.cfg
    problem = gpt2_problem(cfg)
    if problem:
        raise CheckpointError(f"this model does not map onto GPT-2: {problem}")
    sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    d, h, dh, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab
    d_mlp = max(cfg.d_mlp, 4 * d)
    notes: list[str] = []
    zeros = torch.zeros
    out = {
        "transformer.wte.weight": sd["embed.W_E"],
        "transformer.wpe.weight": sd["pos_embed.W_pos"] if cfg.positional == "learned" else zeros(cfg.n_ctx, d),
    }
    if cfg.positional != "learned":
        notes.append("no positional embedding: wpe is all zeros")
    if not cfg.attn_bias:
        notes.append("no attention biases: GPT-2's are zeros")
    if cfg.d_mlp == 0:
        notes.append(f"attention-only: every MLP is {d_mlp} units of zeros (they output exactly 0)")
    elif cfg.d_mlp < d_mlp:
        notes.append(f"MLPs padded from {cfg.d_mlp} to {d_mlp} units with zeros (they output exactly 0)")
    folded_scale = False
    for l in range(cfg.n_layers):
        p, q = f"transformer.h.{l}.", f"blocks.{l}."
        W_Q, W_K = sd[q + "attn.W_Q"], sd[q + "attn.W_K"]  # [h, d, w], w = the layer's widest d_qk
        b_Q, b_K = _bias(sd, q + "attn.b_Q", (h, W_Q.shape[-1])), _bias(sd, q + "attn.b_K", (h, W_K.shape[-1]))
        # GPT-2 divides by sqrt(d_head); a narrower head's 1/sqrt(d_qk) goes into its W_Q, b_Q
        scale = torch.tensor([math.sqrt(dh / cfg.head_d_qk(l, i)) for i in range(h)])
        folded_scale |= bool((scale != 1).any())
        W_Q, b_Q = W_Q * scale[:, None, None], b_Q * scale[:, None]
        W_Q, W_K, b_Q, b_K = _pad(W_Q, 2, dh), _pad(W_K, 2, dh), _pad(b_Q, 1, dh), _pad(b_K, 1, dh)
        W_V, b_V = sd[q + "attn.W_V"], _bias(sd, q + "attn.b_V", (h, dh))
        heads = [W.permute(1, 0, 2).reshape(d, h * dh) for W in (W_Q, W_K, W_V)]  # the importer's split, inverted
        mlp = cfg.d_mlp > 0
        out.update(
            {
                p + "ln_1.weight": sd[q + "ln1.w"],
                p + "ln_1.bias": sd[q + "ln1.b"],
                p + "attn.c_attn.weight": torch.cat(heads, dim=1),
                p + "attn.c_attn.bias": torch.cat([b.reshape(h * dh) for b in (b_Q, b_K, b_V)]),
                p + "attn.c_proj.weight": sd[q + "attn.W_O"].reshape(h * dh, d),
                p + "attn.c_proj.bias": _bias(sd, q + "attn.b_O", (d,)),
                p + "ln_2.weight": sd[q + "ln2.w"] if mlp else torch.ones(d),
                p + "ln_2.bias": sd[q + "ln2.b"] if mlp else zeros(d),
                p + "mlp.c_fc.weight": _pad(sd[q + "mlp.W_in"], 1, d_mlp) if mlp else zeros(d, d_mlp),
                p + "mlp.c_fc.bias": _pad(sd[q + "mlp.b_in"], 0, d_mlp) if mlp else zeros(d_mlp),
                p + "mlp.c_proj.weight": _pad(sd[q + "mlp.W_out"], 0, d_mlp) if mlp else zeros(d_mlp, d),
                p + "mlp.c_proj.bias": sd[q + "mlp.b_out"] if mlp else zeros(d),
            }
        )
    if folded_scale:
        notes.append("heads narrower than d_head: zero query/key columns, 1/sqrt(d_qk) folded into W_Q, b_Q")
    # a tied unembedding (tied_embed) is the embedding: written as a copy of its own (lm_head, untied)
    W_U = sd["unembed.W_U"] if "unembed.W_U" in sd else sd["embed.W_E"].T.clone()
    b_U = sd["unembed.b_U"]
    ln_b = sd["ln_final.b"]
    top = float(b_U.abs().max())
    if top > 0:
        folded, error = fold_unembed_bias(W_U, b_U, ln_b)
        if error > FOLD_TOL * max(1.0, top):
            why = f"d_vocab {V} > d_model {d}" if V > d else "W_U is rank-deficient"
            raise CheckpointError(
                f"this model does not map onto GPT-2: its unembedding bias b_U (max |b_U| = {top:.3g}) is not in "
                f"the row space of W_U ({why}), and GPT-2's lm_head has no bias"
            )
        ln_b = folded
        notes.append(f"b_U folded into ln_f.bias (c W_U = b_U; logits change by at most {error:.1e})")
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_final.w"], ln_b
    out["lm_head.weight"] = W_U.T
    return {k: v.contiguous() for k, v in out.items()}, notes


def tokenizer_files(token_names: list[str], n_ctx: int, words: bool = True) -> dict[str, str]:
    """``vocab.json`` (name -> id, as the importer reads it) and, with ``words``, a word-level
    ``tokenizer.json`` and ``tokenizer_config.json``, so that ``AutoTokenizer.from_pretrained``
    works; empty when names repeat or contain whitespace. Text is split on whitespace, as our tasks type tokens; a word
    that is no token name is dropped whole (the vocabulary has no unknown token, and tools probe
    the tokenizer with arbitrary text: TransformerLens encodes "a")."""
    if len(set(token_names)) != len(token_names) or any(not n or n.split() != [n] for n in token_names):
        return {}
    vocab = {n: i for i, n in enumerate(token_names)}
    if not words:
        return {VOCAB: json.dumps(vocab, indent=1) + "\n"}
    known = "^(?:" + "|".join(re.escape(n) for n in sorted(token_names, key=len, reverse=True)) + ")$"
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {  # words, then only the words that are token names (invert: keep the matches)
            "type": "Sequence",
            "pretokenizers": [
                {"type": "WhitespaceSplit"},
                {"type": "Split", "pattern": {"Regex": known}, "behavior": "Removed", "invert": True},
            ],
        },
        "post_processor": None,
        "decoder": None,  # tokens joined with spaces
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},  # never reached: unknown words are gone
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": n_ctx,
        "clean_up_tokenization_spaces": False,
    }
    return {
        VOCAB: json.dumps(vocab, indent=1) + "\n",
        TOKENIZER: json.dumps(tokenizer, indent=1) + "\n",
        TOKENIZER_CONFIG: json.dumps(config, indent=1) + "\n",
    }


def _readme(loaded: LoadedModel, hf_config: dict, notes: list[str], tokenizer: bool) -> str:
    card = loaded.card
    lines = [
        f"# {loaded.name}",
        "",
        f"Exported by `attn-lab export-hf` from `{loaded.name}` as a transformers GPT-2 "
        f"({hf_config['n_layer']} layers x {hf_config['n_head']} heads, d_model {hf_config['n_embd']}, "
        f"{hf_config['vocab_size']} tokens, context {hf_config['n_positions']}), fp32. "
        "It computes the same logits as the attn-lab model.",
        "",
    ]
    facts = {
        "task": card.task,
        "description": card.description,
        "accuracy": card.accuracy,
        "run id": card.run_id,
        "parent": card.parent,
        "steps": card.steps,
        "seed": card.seed,
        "command": card.command,
    }
    lines += [f"- {k}: {v}" for k, v in facts.items() if v not in (None, "")]
    lines += ["", "How it maps onto GPT-2:", ""] + [f"- {n}" for n in notes or ["exactly, tensor for tensor"]]
    lines += [
        "",
        "## Load",
        "",
        "```python",
        "from transformers import GPT2LMHeadModel" + (", AutoTokenizer" if tokenizer else ""),
        'model = GPT2LMHeadModel.from_pretrained("path/to/this/folder")',
    ]
    if tokenizer:
        lines += ['tok = AutoTokenizer.from_pretrained("path/to/this/folder")  # space-separated token names']
    lines += [
        "```",
        "",
        "attn-lab reads the folder back as any model NAME: `attn-lab spectrum path/to/this/folder`.",
        "",
    ]
    return "\n".join(lines)


def _check_destination(out: Path) -> Path:
    """``out`` once it is clear that the export may be written there: absent or an empty folder
    (``destinations.check_destination``, which gives the true reason otherwise)."""
    try:
        return check_destination(out, empty_ok=True)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def write_folder(out: Path, tensors: dict[str, torch.Tensor], hf_config: dict, files: dict[str, bytes]) -> None:
    """Write ``config.json``, ``model.safetensors`` and ``files`` (name -> bytes) as the folder
    ``out`` (checked with :func:`_check_destination` first): into a temporary sibling, renamed
    into place, so a failure leaves nothing behind and nothing existing is overwritten."""
    _check_destination(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(out.name), dir=out.parent))  # known to remove_stale_tmp
    except OSError as e:
        raise CheckpointError(f"cannot write into {out.parent} ({e.strerror or e})") from None
    tmp.chmod(0o755)  # mkdtemp makes it private; an export is readable like any folder
    try:
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS), metadata={"format": "pt"})
            (tmp / WEIGHTS).chmod(0o644)
            (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
            for name, data in files.items():
                (tmp / name).write_bytes(data)
        except (OSError, SafetensorError) as e:  # a full disk: one line naming the export, nothing left
            raise write_failed(e, out) from None
        try:
            tmp.rename(out)  # replaces an empty folder; one that filled up meanwhile makes it fail
        except OSError:
            raise CheckpointError(f"{out} was created or filled while exporting; nothing was overwritten") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_gpt2(
    loaded: LoadedModel, out: str | Path, token_names: list[str] | None = None, word_tokenizer: bool = True
) -> dict:
    """Write ``loaded`` as a transformers GPT-2 folder at ``out`` (absent or empty; nothing is
    ever overwritten) and return a summary. ``token_names`` (one per token id) become the
    tokenizer (:func:`tokenizer_files`), or only ``vocab.json`` without ``word_tokenizer`` (an
    imported model's names are its own tokenizer's pieces, not words). The destination is
    checked before converting; the folder is written into a temporary sibling and renamed into
    place, so a failure leaves nothing behind."""
    out = Path(out).expanduser()
    problem = gpt2_problem(loaded.config)
    if problem:
        raise CheckpointError(f"{loaded.name} does not map onto GPT-2: {problem}")
    _check_destination(out)
    tensors, notes = gpt2_tensors(loaded.model)  # may still refuse (b_U): before anything is created
    hf_config = gpt2_config(loaded.config)
    hf_config["attn_lab"] = {"source": loaded.name, "task": loaded.card.task, "notes": notes}
    tok = tokenizer_files(token_names, loaded.config.n_ctx, word_tokenizer) if token_names else {}
    files = {name: text.encode("utf-8") for name, text in tok.items()}
    files[README] = _readme(loaded, hf_config, notes, TOKENIZER in tok).encode("utf-8")
    write_folder(out, tensors, hf_config, files)
    written = sorted(p.name for p in out.iterdir())
    return {
        "name": loaded.name,
        "out": str(out),
        "model_type": "gpt2",
        "n_layer": hf_config["n_layer"],
        "n_head": hf_config["n_head"],
        "n_embd": hf_config["n_embd"],
        "n_inner": hf_config["n_inner"] or 4 * hf_config["n_embd"],
        "vocab_size": hf_config["vocab_size"],
        "n_positions": hf_config["n_positions"],
        "tokenizer": TOKENIZER in tok,
        "notes": notes,
        "files": written,
        "bytes": sum((out / f).stat().st_size for f in written),
    }

"""Spectrum tables of every head's QK form: one record per head, and tidy frames for figures.

Singular values of B, eigenvalues of B and of its symmetric part (B + B^T)/2, norms, stable and
effective rank, computed by :class:`attn_core.bilinear.form.QKForm` (docs/maths.md).
"""

from __future__ import annotations

import pandas as pd
import torch

from attn_core.bilinear.checks import check_model
from attn_core.bilinear.heads import layer_forms
from attn_core.model import Transformer


def spectrum(model: Transformer, augmented: bool = False) -> list[dict]:
    """One record per head: singular values, eigenvalues of the symmetric part, norms, ranks; with
    learned sinks (gpt-oss) the head's ``sink_logit`` too (outside B: no singular value has it)."""
    model = check_model(model, "spectrum")
    rows = []
    forms = layer_forms(model, augmented)
    for l in range(model.cfg.n_layers):
        # a layer at a time: the factors and the factorisations' work space are one layer's, not
        # the whole model's (a 28-layer model's symmetric parts and their QR at once are
        # gigabytes); each head's numbers are the same, the batch only groups the same
        # per-matrix computations
        with torch.no_grad():
            form = next(forms)
            out = dict(
                singular_values=form.singular_values,
                eigenvalues_sym=form.eigenvalues_sym,
                stable_rank=form.stable_rank,
                effective_rank=form.effective_rank,
                spectral_norm=form.spectral_norm,
                nuclear_norm=form.nuclear_norm,
                frobenius_norm=form.frobenius_norm,
                eigenvalues=form.eigenvalues,
            )
        for h in range(model.cfg.n_heads):
            row = {"layer": l, "head": h}
            for k, v in out.items():
                v = v[h]
                if k == "eigenvalues":
                    row["eigenvalues_real"] = v.real.tolist()
                    row["eigenvalues_imag"] = v.imag.tolist()
                else:
                    row[k] = v.tolist() if v.dim() else float(v)
            row["rank_cap"] = model.cfg.head_d_qk(l, h) if model.cfg.qk == "factored" else model.cfg.d_model
            if model.cfg.attn_sinks:
                row["sink_logit"] = float(model.blocks[l].attn.form(h).head_sinks().detach())
            rows.append(row)
    return rows


def spectrum_frame(model: Transformer, augmented: bool = False) -> pd.DataFrame:
    """Tidy singular values: layer, head, index, singular_value, normalized (sigma / sigma_1)."""
    model = check_model(model, "spectrum_frame")
    rows = []
    for rec in spectrum(model, augmented):
        top = rec["singular_values"][0] or 1.0
        for i, s in enumerate(rec["singular_values"]):
            rows.append(dict(layer=rec["layer"], head=rec["head"], index=i, singular_value=s, normalized=s / top))
    return pd.DataFrame(rows)


def latent_spectrum_frame(model: Transformer) -> pd.DataFrame:
    """An MLA model's absorbed B on the latents, B_lat = s W_UQ W_UK^T (q_lora_rank x
    kv_lora_rank, what inference multiplies; attn_core/model/mla.py): tidy singular values as
    :func:`spectrum_frame` gives them (layer, head, index, singular_value, normalized)."""
    model = check_model(model, "latent_spectrum_frame")
    if not model.cfg.mla:
        raise ValueError("the latent spectrum needs multi-head latent attention (an MLA model)")
    rows = []
    with torch.no_grad():
        for l in range(model.cfg.n_layers):
            sv = model.blocks[l].attn.form().latent().singular_values.float().cpu()  # [h, k]
            for h in range(model.cfg.n_heads):
                top = float(sv[h, 0]) or 1.0
                for i, v in enumerate(sv[h].tolist()):
                    rows.append(dict(layer=l, head=h, index=i, singular_value=v, normalized=v / top))
    return pd.DataFrame(rows)


def eigen_frame(model: Transformer, augmented: bool = False) -> pd.DataFrame:
    """Tidy eigenvalues of B: layer, head, index, real, imag, modulus."""
    model = check_model(model, "eigen_frame")
    rows = []
    for rec in spectrum(model, augmented):
        for i, (re, im) in enumerate(zip(rec["eigenvalues_real"], rec["eigenvalues_imag"])):
            rows.append(
                dict(
                    layer=rec["layer"], head=rec["head"], index=i, real=re, imag=im, modulus=(re * re + im * im) ** 0.5
                )
            )
    return pd.DataFrame(rows)

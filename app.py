"""attn-lab home: what the lab is, the zoo with its cards, and the shared model picker."""
import pandas as pd
import streamlit as st

import ui
from attn_core import zoo

loaded = ui.setup("attn-lab")

st.markdown(
    "Self-attention scores are a bilinear form $f_x(y) = x^\\top B\\, y$ with "
    "$B = W_Q W_K^\\top / \\sqrt{d_{head}}$ per head. "
    "attn-lab lets you **see** that form as per-query heatmaps over a sequence, the vocabulary and positions, "
    "**measure** its spectrum and how concentrated each query's scores are, and **regularize and retrain** "
    "a toy transformer while you watch the spectrum move. "
    "Pick a model in the sidebar; every page uses it, and every figure downloads as PNG, SVG, HTML or CSV."
)

st.subheader("The zoo")
st.caption("Toy transformers trained by `attn-lab train --preset NAME` and shipped in `assets/models/`. "
           "Accuracy is measured on 512 held-out samples of the model's task.")
models = zoo.list_models()
table = pd.DataFrame([{k: m[k] for k in ("name", "task", "n_layers", "n_heads", "d_model", "d_head", "qk", "d_mlp",
                                         "params", "accuracy")} for m in models])
st.dataframe(
    table, hide_index=True,
    column_config={
        "accuracy": st.column_config.ProgressColumn("accuracy", help="Fraction of scored tokens predicted right "
                                                    "on 512 held-out samples", min_value=0.0, max_value=1.0,
                                                    format="percent"),
        "params": st.column_config.NumberColumn("params", help="Number of parameters"),
        "d_mlp": st.column_config.NumberColumn("d_mlp", help="MLP width; 0 = attention-only"),
        "qk": st.column_config.TextColumn("qk", help="factored: W_Q, W_K per head (rank(B) ≤ d_head); "
                                          "merged: one W_QK = B per head"),
    },
)

cols = st.columns(3)
for i, m in enumerate(models):
    card = zoo.load(m["path"]).card if m["path"] else {}
    with cols[i % 3].container(border=True):
        st.markdown(f"**{m['name']}** · task `{m['task']}`")
        st.caption(card.get("description", ""))
        acc = m["accuracy"]
        st.metric("held-out accuracy", f"{acc:.1%}" if acc is not None else "n/a",
                  help="Fraction of scored tokens predicted right on 512 held-out samples")
        st.caption(f"{m['params']:,} parameters · trained {card.get('steps', '?')} steps in "
                   f"{card.get('wall_time_s', '?')} s · seed {card.get('seed', '?')}")
        st.code(card.get("command", ""), language="bash")

st.subheader("Pages")
st.page_link("app.py", label="Home", icon="🏠")
for page, label in [("pages/1_Heatmaps.py", "Heatmaps of f_x(y) per query"),
                    ("pages/2_Spectrum.py", "Spectrum of B and head detectors"),
                    ("pages/3_Retrain.py", "Regularize and retrain, live"),
                    ("pages/4_Runs.py", "Compare saved runs"),
                    ("pages/5_Grow_d_k.py", "Grow d_k of a head (seed 001)"),
                    ("pages/6_Kernelized_attention.py", "Kernelized attention (seed 002)"),
                    ("pages/7_Attention_explorer.py", "Attention algebra (seed 003)"),
                    ("pages/8_Merged_vs_factored_QK.py", "Merged vs factored QK (seed 004)")]:
    from pathlib import Path

    if (Path(__file__).parent / page).exists():
        st.page_link(page, label=label)

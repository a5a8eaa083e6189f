"""attn-lab home: what the lab is, links to every page, the zoo with its cards, and the shared
model picker."""

import pandas as pd
import streamlit as st

import ui
from attn_core.card import Card
from navigation import PAGES

ui.setup("attn-lab")  # the page config, the title and the sidebar model picker

st.markdown(
    "Each attention head scores a query token $x$ against a key token $y$ with a bilinear form "
    "$f_x(y) = x B y^\\top$, where $B = W_Q W_K^\\top / \\sqrt{d_{head}}$. "
    "attn-lab lets you **see** that form as per-query heatmaps over a sequence, the vocabulary and positions, "
    "and **measure** its spectrum and how concentrated each query's scores are. "
    "You can then **regularize and retrain** a toy transformer while watching the spectrum move, "
    "and download every figure as PNG, SVG, HTML or CSV."
)
st.info(
    "Pick a model in the sidebar: every page uses it. Start with **Heatmaps**, then **Spectrum**, then **Retrain**.",
    icon=":material/arrow_back:",
)

st.subheader("Pages")
cols = st.columns(2)  # each page: its link, what it is for, a small picture; in three the labels were cut
for i, page in enumerate(p for p in PAGES if not p.default):
    with cols[i % 2].container(border=True):
        st.page_link(page.file, label=page.blurb, icon=page.icon)
        if page.screenshot.is_file():  # made by scripts/screenshots.py, shown in the manual's tour too
            st.image(str(page.screenshot), width=320)
        st.caption(page.intro)

st.subheader("The zoo")
st.caption(
    "Toy transformers trained by `attn-lab train --preset NAME` and shipped in `assets/models/`. "
    "Accuracy is measured on 512 held-out samples of the model's task."
)
models = ui.zoo_models()
table = pd.DataFrame(
    [
        {
            k: m[k]
            for k in ("name", "task", "n_layers", "n_heads", "d_model", "d_head", "qk", "d_mlp", "params", "accuracy")
        }
        for m in models
    ]
)
ui.show_table(
    table,
    hide_index=True,
    column_config={
        "accuracy": st.column_config.ProgressColumn(
            "accuracy",
            help="Fraction of scored tokens predicted right on 512 held-out samples",
            min_value=0.0,
            max_value=1.0,
            format="percent",
        ),
        "n_layers": st.column_config.NumberColumn("n_layers", help="Number of transformer blocks"),
        "n_heads": st.column_config.NumberColumn("n_heads", help="Attention heads per layer"),
        "d_model": st.column_config.NumberColumn(
            "d_model", help="Width of the residual stream (size of B is d_model²)"
        ),
        "d_head": st.column_config.NumberColumn(
            "d_head", help="Query/key width per head: rank(B) ≤ d_head when factored"
        ),
        "params": st.column_config.NumberColumn("params", help="Number of parameters"),
        "d_mlp": st.column_config.NumberColumn("d_mlp", help="MLP width; 0 = attention-only"),
        "qk": st.column_config.TextColumn(
            "qk", help="factored: W_Q, W_K per head (rank(B) ≤ d_head); merged: one W_QK = B per head"
        ),
    },
)

cols = st.columns(3)
for i, m in enumerate(models):  # from each model's config and card (zoo.list_models): no weights are loaded here
    with cols[i % 3].container(border=True):
        st.markdown(f"**{ui.plain(m['name'])}** · task {ui.plain(m['task'] or '?')}")  # card text: never markdown
        st.caption(ui.plain(m["description"]))
        acc = m["accuracy"]
        st.metric(
            "held-out accuracy",
            f"{acc:.1%}" if acc is not None else "n/a",
            help="Fraction of scored tokens predicted right on 512 held-out samples",
        )
        st.caption(
            f"{m['params']:,} parameters · trained {m['steps'] or '?'} steps in "
            f"{m['wall_time_s'] or '?'} s · seed {m['seed'] if m['seed'] is not None else '?'}"
        )
        if command := ui.reproduce_command(Card(preset=m["preset"])):
            st.code(command, language="bash", wrap_lines=True)

saved = ui.saved_runs()
st.subheader("Your runs")
if saved:
    st.caption(
        f"{len(saved)} saved run(s) in `{ui.data_dir()}`; each is also in the sidebar's model list "
        "as `run:<id>`. Compare them on the Runs page."
    )
else:
    st.caption(f"No saved runs yet in `{ui.data_dir()}`: retrain a model on the Retrain page.")

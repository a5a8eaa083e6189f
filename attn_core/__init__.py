"""attn-lab's library: the toy transformer, its tasks and zoo, and the analysis of the QK
bilinear form f_x(y) = x B y^T (row vectors, docs/maths.md) with B = W_Q W_K^T / sqrt(d_head). Importable without Streamlit.
Its layers, and where a new model family, view, regularizer or page goes: docs/architecture.md."""

__version__ = "0.1.0"

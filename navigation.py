"""The dashboard's page table: one row per page (its file, sidebar title, URL path, icon and the
line the home page links it with). The router (app.py) builds its ``st.Page`` entries from it, the
home page its links, and the tests their list of pages. A new page is a file in ``app_pages/`` and one
row here (docs/architecture.md). Plain data: no Streamlit import."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The browser tab's icon, a file of the repository: an emoji or a page's :material/...: icon made
# the browser fetch it from a font host (fonts.gstatic.com), which fails offline.
ICON = ROOT / "assets" / "icon.png"
# Where the manual is served: `mkdocs serve` (docs/, offline) answers on this address by default;
# $ATTN_LAB_MANUAL names another (a published copy, say).
MANUAL = os.environ.get("ATTN_LAB_MANUAL", "http://127.0.0.1:8000/")


@dataclass(frozen=True)
class PageEntry:
    file: str  # relative to the repository root (where app.py is)
    title: str  # the sidebar's label and the browser tab's title
    url_path: str  # the page's URL below the server's root; "" for the home page
    icon: str
    blurb: str = ""  # what the home page's link to it says
    intro: str = ""  # "what am I looking at": the line under the page's title, and in the manual's tour

    @property
    def anchor(self) -> str:
        """The page's section of the manual's tour (docs/dashboard.md) and its screenshot's name:
        ``"Grow d_k"`` -> ``grow-d-k`` (docs/images/grow-d-k.png)."""
        return re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")

    @property
    def screenshot(self) -> Path:
        """The page's screenshot in the manual, made by scripts/screenshots.py."""
        return ROOT / "docs" / "images" / f"{self.anchor}.png"

    @property
    def manual(self) -> str:
        """The URL of the page's section in the manual: :data:`MANUAL` (``$ATTN_LAB_MANUAL``)
        followed by ``dashboard.html#<anchor>``."""
        return f"{MANUAL.rstrip('/')}/dashboard.html#{self.anchor}"

    @property
    def default(self) -> bool:
        """The page the root URL opens."""
        return self.url_path == ""


PAGES: tuple[PageEntry, ...] = (
    PageEntry(
        "app_pages/0_Home.py",
        "Home",
        "",
        ":material/home:",
        intro="What each page is for, the zoo of shipped models, and your saved runs.",
    ),
    PageEntry(
        "app_pages/1_Heatmaps.py",
        "Heatmaps",
        "Heatmaps",
        ":material/grid_on:",
        "Heatmaps of f_x(y) per query",
        intro="One head's scores f_x(y) = x B yᵀ and its attention pattern on one input, query by query, with the vocabulary and positional views.",
    ),
    PageEntry(
        "app_pages/2_Spectrum.py",
        "Spectrum",
        "Spectrum",
        ":material/ssid_chart:",
        "Spectrum of B and head detectors",
        intro="The singular values and eigenvalues of every head's B, its norms and ranks, and which heads are previous-token, induction or duplicate-token heads.",
    ),
    PageEntry(
        "app_pages/3_Retrain.py",
        "Retrain",
        "Retrain",
        ":material/model_training:",
        "Regularize and retrain, live",
        intro="Retrain the model with concentration or spectral penalties on chosen heads, and watch loss, entropy and the spectrum move live.",
    ),
    PageEntry(
        "app_pages/4_Runs.py",
        "Runs",
        "Runs",
        ":material/compare:",
        "Compare saved runs",
        intro="Saved runs side by side with their parent: curves, spectra and heatmaps before and after.",
    ),
    PageEntry(
        "app_pages/5_Grow_d_k.py",
        "Grow d_k",
        "Grow_d_k",
        ":material/open_in_full:",
        "Grow d_k of a head along the functional gradient",
        intro="Grow a head's query/key width along the functional gradient and compare the growth methods.",
    ),
    PageEntry(
        "app_pages/6_Kernelized_attention.py",
        "Kernelized attention",
        "Kernelized_attention",
        ":material/functions:",
        "Kernelized attention: random features and Nystrom",
        intro="How well random features and Nyström approximate one head's softmax kernel, and what each costs.",
    ),
    PageEntry(
        "app_pages/7_Attention_explorer.py",
        "Attention explorer",
        "Attention_explorer",
        ":material/calculate:",
        "The algebra of one softmax head",
        intro="The algebra of one softmax head on a toy input you set by hand.",
    ),
    PageEntry(
        "app_pages/8_Merged_vs_factored_QK.py",
        "Merged vs factored QK",
        "Merged_vs_factored_QK",
        ":material/merge:",
        "Merged vs factored QK: one W_QK or W_Q W_K^T",
        intro="One W_QK = B per head against the factored W_Q W_Kᵀ: loss, accuracy and the rank of B, trained on the same data and seeds.",
    ),
    PageEntry(
        "app_pages/9_Circuits.py",
        "Circuits",
        "Circuits",
        ":material/account_tree:",
        "Circuits: OV, copying and composition between heads",
        intro="What each head's OV circuit copies, and how heads compose (Q, K and V composition) across layers.",
    ),
    PageEntry(
        "app_pages/10_Sweeps.py",
        "Sweeps",
        "Sweeps",
        ":material/grid_view:",
        "Sweep regularizers × λ × seeds on Ray",
        intro="Sweep regularizers × λ × seeds over the model on Ray and compare the runs in one table.",
    ),
    PageEntry(
        "app_pages/11_Dynamics.py",
        "Dynamics",
        "Dynamics",
        ":material/timeline:",
        "Training dynamics: scrub checkpoints",
        intro="A run's checkpoints step by step: every view of one step and every metric across training, the phase change shaded.",
    ),
    PageEntry(
        "app_pages/12_Edit_and_compare.py",
        "Edit and compare",
        "Edit_and_compare",
        ":material/content_cut:",
        "Edit a head's B; match heads across models",
        intro="Change a head's B without retraining and measure before and after; match the heads of two models.",
    ),
)


def page(title: str) -> PageEntry:
    """The row of the page titled ``title``."""
    for entry in PAGES:
        if entry.title == title:
            return entry
    raise KeyError(f"no page titled {title!r}; the pages are {', '.join(p.title for p in PAGES)}")

"""The dashboard's page table: one row per page (its file, sidebar title, URL path, icon and the
line the home page links it with). The router (app.py) builds its ``st.Page`` entries from it, the
home page its links, and the tests their list of pages. A new page is a file in ``app_pages/`` and one
row here (docs/architecture.md). Plain data: no Streamlit import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The browser tab's icon, a file of the repository: an emoji or a page's :material/...: icon made
# the browser fetch it from a font host (fonts.gstatic.com), which fails offline.
ICON = ROOT / "assets" / "icon.png"


@dataclass(frozen=True)
class PageEntry:
    file: str  # relative to the repository root (where app.py is)
    title: str  # the sidebar's label and the browser tab's title
    url_path: str  # the page's URL below the server's root; "" for the home page
    icon: str
    blurb: str = ""  # what the home page's link to it says

    @property
    def default(self) -> bool:
        """The page the root URL opens."""
        return self.url_path == ""


PAGES: tuple[PageEntry, ...] = (
    PageEntry("app_pages/0_Home.py", "Home", "", ":material/home:"),
    PageEntry("app_pages/1_Heatmaps.py", "Heatmaps", "Heatmaps", ":material/grid_on:", "Heatmaps of f_x(y) per query"),
    PageEntry(
        "app_pages/2_Spectrum.py", "Spectrum", "Spectrum", ":material/ssid_chart:", "Spectrum of B and head detectors"
    ),
    PageEntry(
        "app_pages/3_Retrain.py", "Retrain", "Retrain", ":material/model_training:", "Regularize and retrain, live"
    ),
    PageEntry("app_pages/4_Runs.py", "Runs", "Runs", ":material/compare:", "Compare saved runs"),
    PageEntry(
        "app_pages/5_Grow_d_k.py",
        "Grow d_k",
        "Grow_d_k",
        ":material/open_in_full:",
        "Grow d_k of a head along the functional gradient",
    ),
    PageEntry(
        "app_pages/6_Kernelized_attention.py",
        "Kernelized attention",
        "Kernelized_attention",
        ":material/functions:",
        "Kernelized attention: random features and Nystrom",
    ),
    PageEntry(
        "app_pages/7_Attention_explorer.py",
        "Attention explorer",
        "Attention_explorer",
        ":material/calculate:",
        "The algebra of one softmax head",
    ),
    PageEntry(
        "app_pages/8_Merged_vs_factored_QK.py",
        "Merged vs factored QK",
        "Merged_vs_factored_QK",
        ":material/merge:",
        "Merged vs factored QK: one W_QK or W_Q W_K^T",
    ),
    PageEntry(
        "app_pages/9_Circuits.py",
        "Circuits",
        "Circuits",
        ":material/account_tree:",
        "Circuits: OV, copying and composition between heads",
    ),
    PageEntry(
        "app_pages/10_Sweeps.py", "Sweeps", "Sweeps", ":material/grid_view:", "Sweep regularizers × λ × seeds on Ray"
    ),
    PageEntry(
        "app_pages/11_Dynamics.py",
        "Dynamics",
        "Dynamics",
        ":material/timeline:",
        "Training dynamics: scrub checkpoints",
    ),
    PageEntry(
        "app_pages/12_Edit_and_compare.py",
        "Edit and compare",
        "Edit_and_compare",
        ":material/content_cut:",
        "Edit a head's B; match heads across models",
    ),
)


def page(title: str) -> PageEntry:
    """The row of the page titled ``title``."""
    for entry in PAGES:
        if entry.title == title:
            return entry
    raise KeyError(f"no page titled {title!r}; the pages are {', '.join(p.title for p in PAGES)}")

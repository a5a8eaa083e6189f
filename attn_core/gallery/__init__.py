"""The figure gallery: every figure of every dashboard page and of the CLI's ``export``, drawn
for a zoo model and an imported Hugging Face model into one folder with an index page
(``attn-lab gallery --out DIR``). It makes the faults a user would otherwise meet visible at
once: labels on top of each other, legends or titles cut off, axes that mislead. The browser
test ``tests/e2e/test_gallery_browser.py`` loads it and checks every figure's laid-out text.

- ``pages``: the figures of the pages that read a model (Heatmaps, Spectrum, Circuits,
  Kernelized attention) and of ``attn-lab export``, each with the width its page gives it;
- ``trained``: the pages whose figures need training (Retrain, Runs, Dynamics, Sweeps, Grow d_k,
  Merged vs factored QK) and the Attention explorer; their runs go into a temporary run store;
- ``models``: a tiny random Llama folder (rotary, grouped-query, 1024 positions), the imported
  model drawn when none is named, and a tiny random DeepSeek-V3 folder (multi-head latent
  attention), whose Heatmaps page has the parts of the score (MLA's two terms);
- ``html``: the folder (index.html, plotly.min.js, PNG exports of the CLI figures).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from attn_core.gallery.pages import Entry

ZOO_MODEL = "induction-2l"


def build(
    out: str | Path,
    quick: bool = False,
    model: str = ZOO_MODEL,
    imported: str | None = None,
    png: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, list[Entry]]:
    """Draw every figure into the new or empty folder ``out``; returns (index page, entries).
    ``model`` is a zoo model with a task; ``imported`` a model without one (default: a tiny
    random Llama written into a temporary folder). ``quick`` trains less and samples less."""
    from attn_core import sources
    from attn_core.destinations import check_destination
    from attn_core.gallery import html, pages, trained
    from attn_core.gallery.models import tiny_deepseek, tiny_llama
    from attn_core.runs import RunStore

    out = check_destination(out)
    say = progress or (lambda _: None)
    entries: list[Entry] = []
    with tempfile.TemporaryDirectory(prefix="attn-lab-gallery-") as tmp:
        zoo = sources.resolve(model)
        if zoo.task is None:
            raise ValueError(f"{model} has no task: the gallery's first model must be one that trains (a zoo model)")
        other = sources.resolve(imported if imported is not None else str(tiny_llama(Path(tmp) / "tiny-llama")))
        mla = sources.resolve(str(tiny_deepseek(Path(tmp) / "tiny-deepseek")))
        store = RunStore(Path(tmp) / "runs")
        # a model folder with a long path, as an imported model's often is (its runs' titles name it)
        wide = (
            Path(tmp)
            / "imported-models"
            / "tiny-llama-24-heads-retrained-on-a-text-in-a-folder-with-a-long-name"
            / "model"
        )
        steps: list[tuple[str, Callable]] = [
            (f"Heatmaps of {zoo.name}", lambda: pages.heatmaps(zoo, quick)),
            (f"Heatmaps of {other.name}", lambda: pages.heatmaps(other, quick)),
            (f"Heatmaps of {mla.name}", lambda: pages.heatmaps(mla, quick)),
            (f"Spectrum of {zoo.name}", lambda: pages.spectrum(zoo, quick)),
            (f"Spectrum of {other.name}", lambda: pages.spectrum(other, quick)),
            ("Retrain and Runs", lambda: trained.retrain_and_runs(zoo, quick, store)),
            ("Retrain with 24 heads on text", lambda: trained.retrain_wide_text(wide, quick, store)),
            ("Dynamics", lambda: trained.dynamics_page(zoo, quick, store)),
            ("Grow d_k", lambda: trained.grow_page(zoo, quick)),
            ("Kernelized attention", lambda: pages.kernels_page(zoo, quick, Path(__file__).resolve().parents[2])),
            ("Attention explorer", lambda: trained.explorer(quick)),
            ("Merged vs factored QK", lambda: trained.qk_page(quick)),
            (f"Circuits of {zoo.name}", lambda: pages.circuits_page(zoo, quick)),
            (f"Circuits of {other.name}", lambda: pages.circuits_page(other, quick)),
            ("Sweeps", lambda: trained.sweeps(zoo, quick, store)),
            (f"Edit and compare of {zoo.name}", lambda: pages.edit_page(zoo, quick)),
            (f"Edit and compare of {other.name}", lambda: pages.edit_page(other, quick)),
            (f"CLI export of {zoo.name}", lambda: pages.cli_exports(zoo, quick)),
            (f"CLI export of {other.name}", lambda: pages.cli_exports(other, quick)),
        ]
        for i, (what, make) in enumerate(steps):
            say(f"{i + 1}/{len(steps)}: {what}")
            entries += list(make())
        store.close()
        note = f"Models: {zoo.name} (zoo) and {other.name} (imported, {other.card.details.get('architecture', '?')})."
        index = html.write(out, entries, note, png)
    return index, entries

"""Every figure of every dashboard page, built with the calls the pages make, at the width the
page gives it (a full row, half, a third...). Each builder returns :class:`Entry` items."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attn_core import bilinear, circuits
from attn_core.bilinear import offsets
from attn_core.figures import Plot
from attn_core.figures import attribution as fa
from attn_core.figures import bilinear as fb
from attn_core.figures import circuits as fc
from attn_core.figures import ranks as franks
from attn_core.figures import rotary as fr
from attn_core.figures import sinks as fs
from attn_core.figures.layout import DEFAULT_HEIGHT, FULL_PX, HALF_PX, THIRD_PX, WIDE_PX
from attn_core.sources import LoadedModel

# Widths of a chart on a 1400-pixel-wide dashboard (sidebar open): a whole row, a half, a third,
# three quarters ([3, 1] columns), three fifths ([3, 2]) and two thirds ([1, 2]); what
# `attn-lab export` writes (kaleido's default width).
FULL, HALF, THIRD, WIDE = FULL_PX, HALF_PX, THIRD_PX, WIDE_PX
THREE_FIFTHS, TWO_THIRDS, EXPORT = 560, 620, 700


@dataclass
class Entry:
    """One figure as a page shows it: the page (or CLI command), what it is, the Plot, its width."""

    page: str
    what: str
    plot: Plot
    width: int

    @property
    def height(self) -> int:
        return int(self.plot.fig.layout.height or DEFAULT_HEIGHT)


def heatmaps(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    """The Heatmaps page: sequence views (one head and the grid), the query's row, why this key,
    value-weighted attention, concentration, vocabulary and positional views; long inputs."""
    page = f"Heatmaps · {m.name}"
    tokens = (
        bilinear.sample_tokens(m, 0) if m.task is not None else bilinear.random_tokens(m, 0, min(24, m.config.n_ctx))
    )
    layer = m.config.n_layers - 1
    query = len(tokens) - 1
    view = bilinear.sequence_view(m, tokens, layer)
    for value in ("scores", "pattern"):
        yield Entry(page, f"sequence view, {value}", fb.view_plot(view, 0, query, value=value), HALF)
    for h in range(m.config.n_heads):
        yield Entry(page, f"grid of every head, head {h}", fb.view_plot(view, h, query), HALF)
    yield Entry(page, "the query's row", fb.query_plot(view, 0, query), WIDE)
    attr = circuits.attribute(m, tokens, layer, 0, query)
    yield Entry(page, "why this key", fa.attribution_plot(attr, top=min(8, len(attr.keys))), HALF)
    yield Entry(page, "winner vs runner-up", fa.runner_up_plot(attr), HALF)
    if m.config.positional == "learned":
        split = circuits.token_position_split(m, tokens, 0, query)
        yield Entry(page, "token and position parts (layer 0)", fa.token_position_plot(split), FULL)
    labels = bilinear.position_labels(m, tokens)
    vw = circuits.value_weighted(m.model, tokens, layer, [0])
    yield Entry(page, "value-weighted attention", fa.value_weighted_plot(vw, labels, layer, [0], 0), FULL)
    yield Entry(page, "concentration table", fb.concentration_plot(view.concentration_table(1)), FULL)
    yield from _sinks(m, page, view, tokens, query)
    yield from _score_parts(m, page, tokens, layer)
    vocab = bilinear.vocabulary_view(m, layer, [0])
    yield Entry(
        page,
        "vocabulary view",
        fb.view_plot(vocab, 0, tokens[query] if tokens[query] < len(vocab.queries) else None),
        HALF,
    )
    if m.config.positional == "learned":
        positions = bilinear.positional_view(m, layer, [0])
        yield Entry(page, "positional view", fb.view_plot(positions, 0, min(query, len(positions.queries) - 1)), HALF)
    elif m.config.positional == "rotary":
        curve = offsets.token_pair_scores(m.model, layer, 0, tokens[query], tokens[query - 1], list(range(0, -64, -1)))
        yield Entry(
            page,
            "a token pair against the offset",
            fr.pair_offset_plot(curve, layer, 0, labels[query], labels[query - 1], actual=-1),
            HALF,
        )
    if m.config.n_ctx > bilinear.LONG_INPUT and m.config.entmax_alpha == 1.0:  # entmax: no long inputs
        yield from _long(m, page, layer)


def probe_sinks(m: LoadedModel, tokens: list[int]):
    """The sinks the Heatmaps page shows: on task samples, else on the input as one probe."""
    from attn_core.text.probes import measure_sinks

    return measure_sinks(m) if m.task is not None else bilinear.sinks(m.model, [tokens], what="this input")


def probe_ranks(m: LoadedModel, tokens: list[int]):
    """The two ranks the Spectrum page shows: on task samples, else on the input as one probe."""
    from attn_core.text.probes import measure_ranks

    return measure_ranks(m) if m.task is not None else bilinear.ranks(m.model, [tokens], what="this input")


def _sinks(m: LoadedModel, page: str, view, tokens: list[int], query: int) -> Iterator[Entry]:
    """The sink-aware mode (one head's scores and pattern, its sinks apart or left out; every head of
    the grid), the concentration without sinks, and every head's key importance."""
    head = 1 % m.config.n_heads
    yield Entry(page, "sink-aware: scores, sinks apart", fs.sink_view_plot(view, head, "apart", value="scores"), HALF)
    yield Entry(page, "sink-aware: pattern, sinks apart", fs.sink_view_plot(view, head, "apart"), HALF)
    yield Entry(page, "sink-aware: pattern without sinks", fs.sink_view_plot(view, head, "renormalized"), HALF)
    table = view.concentration_table(1, without_sinks=True)
    yield Entry(page, "concentration without sinks", fb.concentration_plot(table), FULL)
    yield Entry(page, "attention sinks of every head", fs.importance_plot(probe_sinks(m, tokens)), FULL)


def _score_parts(m: LoadedModel, page: str, tokens: list[int], layer: int) -> Iterator[Entry]:
    """The parts of head 0's scores, as the Heatmaps page draws them (``ui/heatmap_form.py``) where
    the model's scores have parts: QK-norm's gains, the capped scores, the affine form's terms, the
    learned sink's share beside token 0's, an MLA head's two terms (its absorbed B's and the rotary one)."""
    from attn_core.figures import score_parts as fp

    parts = bilinear.score_parts(m, tokens, layer, 0)
    if parts.norm != "none":
        yield Entry(page, "parts of the score: the gains", fp.gains_plot(parts), HALF)
    if parts.cap is not None:
        yield Entry(page, "parts of the score: after the soft cap", fp.capped_plot(parts, True), HALF)
    if parts.terms is not None:
        yield Entry(page, "parts of the score: the bias terms", fp.terms_plot(parts), HALF)
    if parts.sink_share is not None:
        yield Entry(page, "parts of the score: the learned sink", fp.sink_share_plot(parts), HALF)
    if parts.absorbed is not None:
        yield Entry(page, "parts of the score: MLA's two terms", fp.mla_terms_plot(parts), FULL)


def _long(m: LoadedModel, page: str, layer: int) -> Iterator[Entry]:
    """The one view of inputs over ``blocked.LONG_INPUT`` tokens: the exact window of the query
    (``bilinear.long``), then the blocked figures."""
    long_tokens = bilinear.random_tokens(m, 0, bilinear.LONG_INPUT + 88)
    lv = bilinear.layer_scores(m, long_tokens, layer).view(0, 500, blocks=None)
    for value in ("scores", "pattern"):
        yield Entry(page, f"long input: window, {value}", fb.window_plot(lv, value), HALF)
    yield from _blocked(m, page, layer, long_tokens)


def _blocked(m: LoadedModel, page: str, layer: int, tokens: list[int]) -> Iterator[Entry]:
    """The blocked figures of a long input's view (``ui.heatmap_long``)."""
    from attn_core.bilinear import blocked
    from attn_core.bilinear.long_map import long_map
    from attn_core.figures import long_view as fl

    qk = blocked.layer_qk(m.model, tokens, layer)
    stats = blocked.row_stats(qk, 0)
    labels = bilinear.position_labels(m, tokens)
    yield Entry(
        page, "blocked: multi-resolution map, sink apart", fl.map_plot(long_map(qk, stats, pixels=256), 500), FULL
    )
    zoom = long_map(qk, stats, rows=(440, 520), cols=(400, 520))
    yield Entry(page, "blocked: a zoom at full resolution", fl.map_plot(zoom, 500), FULL)
    yield Entry(page, "blocked: a query's top keys", fl.query_top_plot(stats, layer, 500, labels), WIDE)
    yield Entry(page, "blocked: entropy and sink mass per query", fl.rows_plot(stats, layer, labels), FULL)
    yield Entry(page, "blocked: offset profile", fl.offsets_plot(stats, layer), WIDE)


def spectrum_page(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    """The Spectrum page: singular values (all heads, normalised, per layer, one head),
    eigenvalues, the symmetric part, head detectors and, for rotary heads, B(delta)."""
    page = f"Spectrum · {m.name}"
    sigma, eigen = bilinear.spectrum_frame(m.model), bilinear.eigen_frame(m.model)
    yield Entry(page, "singular values, every head", fb.spectrum_plot(sigma), HALF)
    yield Entry(page, "singular values, σ/σ₁", fb.spectrum_plot(sigma, normalized=True), HALF)
    yield Entry(page, "singular values, a panel per layer", fb.spectrum_plot(sigma, small_multiples=True), HALF)
    one = sigma[(sigma["layer"] == 0) & (sigma["head"] == 1)]
    yield Entry(page, "singular values, one head", fb.spectrum_plot(one), HALF)
    yield Entry(page, "eigenvalues", fb.eigen_plot(eigen), HALF)
    rows = bilinear.spectrum_rows(m.model)
    import pandas as pd

    table = pd.DataFrame(
        [{"layer": r["layer"], "head": r["head"], "eigenvalues_sym": r["eigenvalues_sym"]} for r in rows]
    )
    yield Entry(page, "eigenvalues of the symmetric part", fb.eigen_sym_plot(table), FULL)
    tokens = (
        bilinear.sample_tokens(m, 0) if m.task is not None else bilinear.random_tokens(m, 0, min(64, m.config.n_ctx))
    )
    both = probe_ranks(m, tokens)
    yield Entry(page, "the two ranks of each head", franks.ranks_plot(both), FULL)
    yield Entry(page, "cumulative variance of B and S_c", franks.variance_plot(both, 0, 0), HALF)
    yield Entry(page, "head detectors", fb.heads_plot(bilinear.head_detectors(m.model, n_samples=8)), FULL)
    if m.config.positional == "rotary":
        by, ref = (
            offsets.offset_spectrum(m.model, 0, 0, list(range(0, -64, -1))),
            offsets.reference_spectra(m.model, 0, 0),
        )
        yield Entry(page, "B(δ) against the offset", fr.offset_spectrum_plot(by, ref, 0, 0), FULL)


def circuits_page(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    """The Circuits page: OV spectra, composition (raw, corrected, as a graph), positivity, the
    full OV circuit."""
    page = f"Circuits · {m.name}"
    heads, spectrum_frame = circuits.head_circuits(m.model), circuits.ov_spectrum_frame(m.model)
    yield Entry(page, "OV spectra", fc.ov_spectrum_plot(spectrum_frame), FULL)
    if m.config.n_layers > 1:
        comp = circuits.composition(m.model, n_samples=16 if quick else 64, seed=0)
        import pandas as pd

        composed = pd.DataFrame(
            circuits.composed_qk_positivities(m.model, comp),
            columns=["layer", "head", "writer", "qk_positivity_composed"],
        )
        heads = heads.merge(composed, on=["layer", "head"], how="left")
        yield Entry(page, "composition", fc.composition_plot(comp), FULL)
        yield Entry(page, "composition, baseline-corrected", fc.composition_plot(comp, corrected=True), FULL)
        yield Entry(page, "composition graph", fc.head_graph_plot(comp, corrected=True, top=12), FULL)
    yield Entry(page, "QK vs OV positivity", fc.positivity_plot(heads), FULL)
    n = min(m.config.d_vocab, 64)
    names = bilinear.token_names(m)[:n]
    score = float(heads[(heads["layer"] == 0) & (heads["head"] == 0)]["copying_score"].iloc[0])
    ov = circuits.full_ov_circuit(m.model, 0, 0, list(range(n)) if n < m.config.d_vocab else None)
    yield Entry(page, "full OV circuit", fc.ov_circuit_plot(ov, names, 0, 0, score), FULL)


def cli_exports(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    """``attn-lab export --figure F`` for every F, as the CLI builds them (written at kaleido's
    default size, 700 x 500)."""
    page = f"CLI export · {m.name}"
    tokens = (
        bilinear.sample_tokens(m, 0) if m.task is not None else bilinear.random_tokens(m, 0, min(24, m.config.n_ctx))
    )
    view = bilinear.sequence_view(m, tokens, 0, [0])
    vocab = bilinear.vocabulary_view(m, 0, [0])
    yield Entry(page, "--figure scores", fb.view_plot(view, 0, None, value="scores", width=EXPORT), EXPORT)
    yield Entry(page, "--figure pattern", fb.view_plot(view, 0, None, value="pattern", width=EXPORT), EXPORT)
    yield Entry(page, "--figure query", fb.query_plot(view, 0, len(tokens) - 1, width=EXPORT), EXPORT)
    yield Entry(page, "--figure vocab", fb.view_plot(vocab, 0, None, value="scores", width=EXPORT), EXPORT)
    yield Entry(page, "--figure vocab-pattern", fb.view_plot(vocab, 0, None, value="pattern", width=EXPORT), EXPORT)
    if m.config.positional == "learned":
        yield Entry(
            page,
            "--figure positional",
            fb.view_plot(bilinear.positional_view(m, 0, [0]), 0, None, width=EXPORT),
            EXPORT,
        )
    yield Entry(page, "--figure spectrum", fb.spectrum_plot(bilinear.spectrum_frame(m.model)), EXPORT)
    yield Entry(page, "--figure eigenvalues", fb.eigen_plot(bilinear.eigen_frame(m.model)), EXPORT)
    yield Entry(page, "--figure concentration", fb.concentration_plot(bilinear.concentration_table(m, tokens)), EXPORT)
    yield Entry(page, "--figure heads", fb.heads_plot(bilinear.head_detectors(m.model, n_samples=8)), EXPORT)
    for figure, mode in (("pattern-sinks-apart", "apart"), ("pattern-no-sinks", "renormalized")):
        yield Entry(page, f"--figure {figure}", fs.sink_view_plot(view, 0, mode, width=EXPORT), EXPORT)
    if m.task is not None:  # export's sinks and ranks are measured on task samples
        yield Entry(
            page,
            "--figure sinks (attn-lab sinks --out)",
            fs.importance_plot(probe_sinks(m, tokens), width=EXPORT),
            EXPORT,
        )
        yield Entry(page, "--figure ranks", franks.ranks_plot(probe_ranks(m, tokens), width=EXPORT), EXPORT)


def kernels_page(m: LoadedModel, quick: bool, root: Path) -> Iterator[Entry]:
    """The Kernelized attention page: error against m, exact vs approximate, the speed charts."""
    from attn_core import kernels
    from attn_core.figures import kernels as fk

    page = f"Kernelized attention · {m.name}"
    samples = m.task.sample(2, 0, "test").tokens
    qkv = kernels.head_qkv(m.model, samples, 1, 0)
    features = (4, 16, 64) if quick else tuple(f for f in kernels.FEATURES if f <= 256)
    errors = kernels.error_curve(*qkv, ("favor", "nystromformer"), features, range(2), True)
    yield Entry(page, "relative error against m", fk.error_curves(errors, "rel_error"), HALF)
    yield Entry(page, "total variation against m", fk.error_curves(errors, "tv"), HALF)
    one = samples[:1]
    exact, approx = kernels.head_patterns(m.model, one, 1, 0, "favor", features[-1], 0, True)
    names = bilinear.token_names(m)
    yield Entry(
        page,
        "exact vs approximate pattern",
        fk.pattern_comparison(
            exact[0], approx[0], [names[t] for t in one[0].tolist()], f"favor, m={features[-1]} (seed 0)"
        ),
        FULL,
    )
    bench = root / "benchmarks" / "results" / "kernels.json"
    if bench.is_file():
        result = json.loads(bench.read_text())
        for part in (result, result.get("causal")):
            if part:
                yield Entry(page, "speed against exact attention", fk.speed_chart(part), FULL)


def edit_page(m: LoadedModel, quick: bool) -> Iterator[Entry]:
    """The Edit and compare page: the head's attention before/after a rank-1 edit and its modes
    (a model with a task), and the diff of the model against that edit of itself, layer by layer."""
    from attn_core import surgery
    from attn_core.figures import surgery as fsu

    page = f"Edit and compare · {m.name}"
    layer = m.config.n_layers - 1
    edit = surgery.HeadEdit(layer, 0, rank=1)
    if m.task is not None:
        inputs = surgery.edit_inputs(m, samples=4 if quick else 16)
        shown = surgery.edit_preview(m, [edit], inputs, layer, 0)
        names = bilinear.token_names(m)
        labels = [names[int(t)] for t in inputs.tokens[0]]
        before = surgery.head_pattern(m.model, inputs.tokens[0], layer, 0)
        yield Entry(
            page, "attention before/after", fsu.pattern_pair_plot(before, shown.pattern, labels, layer, 0), FULL
        )
        modes = surgery.head_modes(m.model, layer, 0)
        yield Entry(page, "modes before/after", fsu.modes_plot(modes, shown.edited.factors[0]), HALF)
        edited = shown.edited.loaded
    else:
        edited = surgery.edit_model(m, [edit]).loaded
    result = surgery.diff(m, edited)
    for ld in result.layers:
        yield Entry(page, f"diff, layer {ld.layer}", fsu.diff_plot(ld, m.name, f"{m.name} (edited)"), HALF)

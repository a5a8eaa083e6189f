"""The figure gallery (`attn-lab gallery`) in headless Chromium: every figure of every page and of
`attn-lab export`, for a zoo model and an imported Llama, drawn by plotly.js at the width its page
gives it. For each figure, every visible text (tick labels, titles, legends, annotations, colour
bars, point labels) is read as laid out on screen (getBBox through the screen transform, so
rotated labels are their true quadrilaterals): no two may overlap, and none may be cut by the
figure's edge or by its legend's box, and no label written into a plot (an annotation) may sit
on a data point. No line (an arrow, a shape's edge) may run through a label; a legend may not
scroll nor cover another text, and no two of its entries may look the same; numeric ticks are
round (a step of 1, 2, 2.5 or 5 times a power of ten, written with a mantissa from 1 to 10); the
cells of a vocabulary or positional view are square. Tables write no "None" and no noise digits,
and an animation opens on the step its slider shows, without playing by itself. The figures' data keep the house rules too: bars start at
zero, measures bounded by 0 and 1 show that whole range. Screenshots of every figure land in
tests/artifacts/gallery/ to be looked at."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from attn_core.figures import export_bytes
from attn_core.figures.layout import UNIT_TITLE
from attn_core.gallery import build
from benchmarks.dashboard import CHROMIUM, launch

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts" / "gallery"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]

# Every visible <text> of each figure as the quadrilateral its glyph box covers on screen; pairs
# that overlap (by more than a 1.5 px touch), texts outside the figure or outside their legend.
CHECK = """() => {
  // Each visible text as the quadrilateral its glyph box covers on screen (rotation included).
  const quad = el => {
    const bb = el.getBBox(), m = el.getScreenCTM();
    const pt = (x, y) => ({x: m.a * x + m.c * y + m.e, y: m.b * x + m.d * y + m.f});
    return [pt(bb.x, bb.y), pt(bb.x + bb.width, bb.y), pt(bb.x + bb.width, bb.y + bb.height), pt(bb.x, bb.y + bb.height)];
  };
  const visible = el => {
    if (!el.textContent.trim()) return false;
    for (let e = el; e && e.nodeType === 1; e = e.parentNode) {
      const cs = getComputedStyle(e);
      if (cs.display === 'none' || cs.visibility === 'hidden' || cs.opacity === '0') return false;
    }
    const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0;
  };
  // Separating-axis test of two convex quads, each shrunk by `pad` px (a touch is not an overlap).
  const shrink = (q, pad) => { const cx = q.reduce((s, p) => s + p.x, 0) / 4, cy = q.reduce((s, p) => s + p.y, 0) / 4;
    return q.map(p => { const dx = p.x - cx, dy = p.y - cy, d = Math.hypot(dx, dy) || 1; return {x: p.x - pad * dx / d, y: p.y - pad * dy / d}; }); };
  const overlap = (a, b) => {
    a = shrink(a, 1.5); b = shrink(b, 1.5);
    for (const q of [a, b]) for (let i = 0; i < 4; i++) {
      const p1 = q[i], p2 = q[(i + 1) % 4], nx = p2.y - p1.y, ny = p1.x - p2.x;
      const pa = a.map(p => p.x * nx + p.y * ny), pb = b.map(p => p.x * nx + p.y * ny);
      if (Math.max(...pa) <= Math.min(...pb) || Math.max(...pb) <= Math.min(...pa)) return false;
    }
    return true;
  };
  const inside = (q, r, pad) => q.every(p => p.x >= r.left - pad && p.x <= r.right + pad && p.y >= r.top - pad && p.y <= r.bottom + pad);
  const kind = el => { const g = el.closest('g[class]'); return g ? g.getAttribute('class').split(' ')[0] : '?'; };
  const out = [];
  for (const fig of document.querySelectorAll('figure.fig')) {
    const div = fig.querySelector('.plot');
    const paper = div.querySelector('svg.main-svg').getBoundingClientRect();
    const items = Array.from(div.querySelectorAll('svg text')).filter(visible)
      .map(el => ({el, q: quad(el), text: el.textContent.trim().slice(0, 48), kind: kind(el)}));
    const problems = [];
    for (const it of items) {
      if (!inside(it.q, paper, 1)) problems.push(`cut by the figure's edge: "${it.text}" (${it.kind})`);
      const legend = it.el.closest('.legend'), bg = legend && legend.querySelector('rect.bg');
      if (bg && !inside(it.q, bg.getBoundingClientRect(), 1)) problems.push(`cut by the legend's box: "${it.text}"`);
    }
    for (let i = 0; i < items.length; i++) for (let j = i + 1; j < items.length; j++)
      if (overlap(items[i].q, items[j].q)) problems.push(`overlap: "${items[i].text}" (${items[i].kind}) / "${items[j].text}" (${items[j].kind})`);
    // An annotation (a label written into the plot) must not hide a data point.
    const points = Array.from(div.querySelectorAll('.scatterlayer path.point')).filter(el => {
      const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(el).opacity !== '0';
    }).map(el => { const r = el.getBoundingClientRect();
      return [{x: r.left, y: r.top}, {x: r.right, y: r.top}, {x: r.right, y: r.bottom}, {x: r.left, y: r.bottom}]; });
    for (const it of items.filter(it => it.el.closest('.annotation')))
      if (points.some(q => overlap(it.q, q))) problems.push(`a data point under the label "${it.text}" (annotation)`);
    // A line drawn through a label: an annotation's arrow or a shape's edge (a box, a zero line).
    const lines = Array.from(div.querySelectorAll('.annotation-arrow-g path, .shapelayer path')).filter(el => {
      const r = el.getBoundingClientRect(); return (r.width > 0 || r.height > 0) && getComputedStyle(el).display !== 'none';
    });
    for (const it of items.filter(it => !it.el.closest('.legend'))) {
      const inner = shrink(it.q, 1.5);
      const within = p => { // inside the convex quad: on the inner side of each edge
        let sign = 0;
        for (let i = 0; i < 4; i++) { const a = inner[i], b = inner[(i + 1) % 4];
          const c = (b.x - a.x) * (p.y - a.y) - (b.y - a.y) * (p.x - a.x);
          if (c !== 0) { if (sign && Math.sign(c) !== sign) return false; sign = Math.sign(c); } }
        return true; };
      for (const line of lines) {
        const m = line.getScreenCTM(), n = line.getTotalLength();
        for (let d = 0; d <= n; d += 1.5) { const p = line.getPointAtLength(d);
          if (within({x: m.a * p.x + m.c * p.y + m.e, y: m.b * p.x + m.d * p.y + m.f})) {
            problems.push(`a line through the label "${it.text}" (${line.closest('.annotation-arrow-g') ? 'an arrow' : 'a shape'})`);
            break; } }
      }
    }
    // A legend that scrolls (its entries cut, the box drawn over what is under it) or whose box
    // covers a text that is not its own; legend entries that look alike (the same colour and dash).
    for (const legend of div.querySelectorAll('.legend')) {
      const bar = legend.querySelector('.scrollbar'), box = legend.querySelector('rect.bg');
      if (bar && bar.getBoundingClientRect().height > 0) problems.push('the legend scrolls: some entries are hidden');
      const r = box && box.getBoundingClientRect();
      if (r) for (const it of items.filter(it => !it.el.closest('.legend')))
        if (overlap(it.q, [{x: r.left, y: r.top}, {x: r.right, y: r.top}, {x: r.right, y: r.bottom}, {x: r.left, y: r.bottom}]))
          problems.push(`the legend's box covers "${it.text}" (${it.kind})`);
      const seen = {};
      for (const entry of legend.querySelectorAll('.traces')) {
        const name = entry.querySelector('text')?.textContent.trim();
        const marks = Array.from(entry.querySelectorAll('.legendlines path, .legendpoints path'));  // its line (dash) and marker
        if (!name || !marks.length) continue;
        const look = marks.map(mark => { const cs = getComputedStyle(mark);
          return [cs.stroke, cs.fill, cs.strokeDasharray, cs.strokeWidth, cs.opacity, mark.getAttribute('d')].join('|'); }).join(';');
        if (seen[look] && seen[look] !== name) problems.push(`legend entries "${seen[look]}" and "${name}" look the same`);
        seen[look] = seen[look] || name;
      }
    }
    // Numeric ticks: a step of 1, 2, 2.5 or 5 times a power of ten, every tick a multiple of it,
    // and a power of ten written with a mantissa from 1 to 10 (never 0.2×10⁴).
    const full = div._fullLayout;
    for (const key of Object.keys(full).filter(k => /^[xy]axis\\d*$/.test(k))) {
      const ax = full[key];
      if (!ax || ax.type !== 'linear' || !ax.visible || !ax._vals) continue;
      const ticks = ax._vals.filter(v => v.text !== undefined && String(v.text).trim() !== '');
      for (const v of ticks) {
        const t = String(v.text).replace(/<[^>]+>/g, ' ').replace(/\u200b/g, '');
        const m = t.match(/^\\s*[−-]?([\\d.]+)\\s*×\\s*10/);
        if (m && (parseFloat(m[1]) < 1 || parseFloat(m[1]) >= 10)) problems.push(`tick "${t.trim()}" on ${key}: write a mantissa from 1 to 10`);
      }
      // only ticks written as numbers (token labels thinned to every k-th are not numbers)
      const number = v => /^\\s*[−-]?[\\d.]+(\\s*×\\s*10\\s*[−-]?\\d+)?\\s*$/.test(String(v.text).replace(/<[^>]+>/g, ' ').replace(/\u200b/g, ''));
      if (!ticks.every(number)) continue;
      const xs = [...new Set(ticks.map(v => +v.x))].sort((a, b) => a - b);
      if (xs.length < 3) continue;
      const step = xs[1] - xs[0], scale = Math.pow(10, Math.floor(Math.log10(step)));
      const mant = step / scale, nice = [1, 2, 2.5, 5, 10].some(n => Math.abs(mant - n) < 1e-6 * n);
      const even = xs.every((x, i) => i === 0 || Math.abs(x - xs[i - 1] - step) <= 1e-6 * step);
      const whole = xs.every(x => Math.abs(x / step - Math.round(x / step)) < 1e-6);
      if (!(nice && even && whole)) problems.push(`ticks of ${key} are not round: ${ticks.slice(0, 4).map(v => String(v.text).replace(/<[^>]+>/g, '')).join(', ')}`);
    }
    // Square cells where rows and columns are the same things (every token, every position).
    if (/^(vocabulary|positional)_/.test(fig.dataset.name)) {
      const heat = (div._fullData || []).find(t => t.type === 'heatmap');
      if (heat && heat.z && heat.z.length) {
        const w = full.xaxis._length / heat.z[0].length, h = full.yaxis._length / heat.z.length;
        if (Math.max(w, h) / Math.min(w, h) > 1.1) problems.push(`cells of ${w.toFixed(1)} × ${h.toFixed(1)} px: not square`);
      }
    }
    out.push({id: div.id, name: fig.dataset.name, page: fig.dataset.page, what: fig.dataset.what, texts: items.length, problems});
  }
  return out;
}"""


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    index, entries = build(tmp_path_factory.mktemp("gallery") / "out", quick=True)
    return index, entries


@pytest.fixture(scope="module")
def laid_out(gallery):
    from playwright.sync_api import sync_playwright

    index, _ = gallery
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(index.as_uri(), timeout=300_000)  # 150 figures' JSON and plotly.js, on a busy machine
        page.wait_for_function("() => document.body.dataset.ready", timeout=600_000)
        assert page.evaluate("() => document.body.dataset.ready") == "yes", page.evaluate(
            "() => document.body.dataset.error"
        )
        result = page.evaluate(CHECK)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        figures = page.locator("figure.fig")
        for i in range(figures.count()):
            figures.nth(i).screenshot(path=str(ARTIFACTS / f"{i:03d}-{figures.nth(i).get_attribute('data-name')}.png"))
        browser.close()
    return result


def test_the_gallery_has_every_page_and_both_models(gallery):
    index, entries = gallery
    pages = {e.page for e in entries}
    for name in ("Heatmaps", "Spectrum", "Retrain", "Runs", "Grow d_k", "Kernelized attention", "Attention explorer",
                 "Merged vs factored QK", "Circuits", "Sweeps", "Dynamics", "CLI export", "Edit and compare"):  # fmt: skip
        assert any(p.startswith(name) for p in pages), name
    assert any("tiny-llama" in p for p in pages) and any("induction-2l" in p for p in pages)
    assert len(json.loads((index.parent / "figures.json").read_text())) == len(entries)
    assert list((index.parent / "png").glob("*.png"))  # the CLI figures as `attn-lab export` writes them


def test_no_label_overlaps_another_or_is_cut(laid_out):
    assert len(laid_out) > 100
    assert all(f["texts"] > 0 for f in laid_out)
    bad = {f"{f['page']} / {f['what']} ({f['name']})": f["problems"][:5] for f in laid_out if f["problems"]}
    assert not bad, json.dumps(bad, indent=1, ensure_ascii=False)


def test_bars_start_at_zero_and_bounded_measures_keep_their_range(gallery):
    _, entries = gallery
    for e in entries:
        layout = e.plot.fig.layout
        for trace in e.plot.fig.data:
            if trace.type == "bar":
                ref = (trace.xaxis if trace.orientation == "h" else trace.yaxis) or (
                    "x" if trace.orientation == "h" else "y"
                )
                axis = layout[f"{ref[0]}axis{ref[1:]}"]
                assert axis.type != "log" and (axis.rangemode == "tozero" or (axis.range and axis.range[0] <= 0)), (
                    e.plot.name
                )
        for key in [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
            title = layout[key].title.text or ""
            if UNIT_TITLE.search(title):
                lo, hi = layout[key].range or (None, None)  # the whole of 0..1, and little more
                assert lo is not None and -0.1 <= lo <= 0 and 1 <= hi <= 1.1, (e.plot.name, key, title, lo, hi)


def _legend(entries, page: str, name: str) -> list[tuple[str, str]]:
    """(name, mode) of each legend entry of the last figure ``name...`` of ``page``."""
    fig = [e.plot.fig for e in entries if e.page.startswith(page) and e.plot.name.startswith(name)][-1]
    return [(t.name, t.mode or "") for t in fig.data if t.showlegend is not False and t.name]


def test_every_mark_is_explained_and_numbers_are_powers_of_ten(gallery):
    """What the user first met unexplained: the Pareto frontier's legend entry without its line and
    marker sizes with no key (Sweeps), which end of a run's change is before and which after
    (Runs), the stable rank without a legend entry (Retrain), the red rings and the dotted box of
    the positivity scatter (Circuits), the cut and the old width of the grown head named by labels
    on top of the data (Grow d_k); and SI prefixes (1µ, 1n) where powers of ten are meant."""
    _, entries = gallery
    pareto = dict(_legend(entries, "Sweeps", "sweep_pareto"))
    assert "lines" in pareto["Pareto frontier"] and any(n.startswith("λ = ") for n in pareto)
    sweep = [e.plot.fig for e in entries if e.page.startswith("Sweeps")][-1]
    assert any(t.legendgrouptitle.text == "marker size" for t in sweep.data)
    trade = [n for n, _ in _legend(entries, "Runs", "tradeoff")]
    assert "before (the parent)" in trade and "after (the run)" in trade
    assert "stable rank (right axis)" in [n for n, _ in _legend(entries, "Retrain", "spectrum_history")]
    circuits = [n for n, _ in _legend(entries, "Circuits", "positivity")]
    assert any(n.startswith("QK read through") for n in circuits) and any(n.startswith("both > 0.5") for n in circuits)
    grow = [e.plot.fig for e in entries if e.page.startswith("Grow") and e.plot.name.startswith("grow_spectrum")][0]
    assert not grow.layout.annotations  # no label drawn over the singular values
    named = {t.name: t.mode for t in grow.data}
    assert any(n.startswith("cut: d_k + p = ") and m == "lines" for n, m in named.items())
    assert any(n.startswith("old d_k = ") and m == "lines" for n, m in named.items())
    for e in entries:
        layout = e.plot.fig.layout
        for key in [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
            assert layout[key].exponentformat == "power", (e.page, e.plot.name, key)


def test_tables_write_no_none_and_no_noise_digits(gallery):
    """A table's cells: a missing value is a dash, a number has at most 4 significant digits
    (``0.00000000000006`` is a rounding residue of 0, not information)."""
    _, entries = gallery
    tables = [t for e in entries for t in e.plot.fig.data if t.type == "table"]
    assert tables
    for table in tables:
        for column in table.cells.values:
            for cell in column:
                text = str(cell)
                assert text not in ("None", "nan", "NaN", "<NA>"), text
                number = re.fullmatch(r"[−-]?(\d*\.?\d*)(e[+-]?\d+)?", text)
                if number and number.group(1):
                    digits = number.group(1).replace(".", "").lstrip("0")
                    assert len(digits) <= 4, text  # four significant digits at most


def test_an_animation_opens_on_its_slider_step_and_waits(gallery):
    """The Dynamics animation (page and ``dynamics --animate``) shows the step its slider is on,
    and plays only when asked (an HTML export that played by itself showed the slider at step 0
    over the last step)."""
    _, entries = gallery
    animations = [e for e in entries if e.plot.fig.frames]
    assert animations
    for e in animations:
        fig = e.plot.fig
        assert b"Plotly.animate(" not in export_bytes(e.plot, "html")
        slider = fig.layout.sliders[0]
        shown = slider.steps[slider.active].args[0][0]
        frame = next(f for f in fig.frames if f.name == shown)
        assert np.array_equal(
            np.asarray(frame.data[0].z, dtype=float), np.asarray(fig.data[0].z, dtype=float), equal_nan=True
        )

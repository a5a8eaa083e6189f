"""Long-input views (attn_core.bilinear.long, on the blocked engine) against the model's own dense
scores: the window is the model's S and A, the top-k keys are torch.topk of the full row, the
overview is an independent pooling of the dense matrix, and the forward stops at the needed
layer; alpha-entmax heads are refused in one sentence."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import bilinear as bl
from attn_core.hooks import act_name
from attn_core.sources import LoadedModel, resolve
from tests.conftest import make_tiny_model, write_tiny_gpt2

BASE = dict(n_layers=3, n_heads=3, d_model=24, d_head=6, d_vocab=12, n_ctx=40)
KINDS = {
    "factored": {},
    "biased_mlp": dict(attn_bias=True, d_mlp=16),
    "merged": dict(qk="merged"),
    "gqa_window": dict(n_kv_heads=1, sliding_window=[9, 0, 5], positional="rotary", attn_softcap=3.0),
}


def loaded(**kw) -> LoadedModel:
    model = make_tiny_model(seed=1, std=0.4, **{**BASE, **kw})
    return LoadedModel("test", model, model.cfg)


def dense(lm: LoadedModel, tokens: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """S and A of every head from a full forward's cache (the reference)."""
    names = [act_name("attn_scores", layer), act_name("pattern", layer)]
    with torch.no_grad():
        _, cache = lm.model.run_with_cache(torch.tensor([tokens]), names_filter=names)
    return cache[names[0]][0], cache[names[1]][0]


def pooled_by_loops(M: torch.Tensor, block: int, how: str, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Pool a causal [n, n] matrix (visible where ``seen``, default k <= q) tile by tile, one visible
    cell list per tile."""
    n = M.shape[0]
    seen = torch.ones(n, n, dtype=torch.bool).tril() if seen is None else seen
    nb = math.ceil(n / block)
    out = torch.full((nb, nb), math.nan)
    for a in range(nb):
        for b in range(nb):
            cells = [
                float(M[q, k])
                for q in range(a * block, min(n, (a + 1) * block))
                for k in range(b * block, min(n, (b + 1) * block))
                if seen[q, k]
            ]
            if cells:
                out[a, b] = max(cells) if how == "max" else sum(cells) / len(cells)
    return out


TOKENS = [int(t) for t in torch.randint(0, 12, (37,), generator=torch.Generator().manual_seed(3))]


@pytest.mark.parametrize("kind", list(KINDS))
def test_layer_scores_are_the_models_own(kind):
    lm = loaded(**KINDS[kind])
    for layer in range(3):
        S, A = dense(lm, TOKENS, layer)
        ls = bl.layer_scores(lm, TOKENS, layer)
        assert ls.n == 37 and ls.n_heads == 3
        for h in range(3):
            mine = ls.scores(h)
            assert torch.equal(mine.isfinite(), ls.mask)  # -inf where the key is not visible
            torch.testing.assert_close(mine[ls.mask], S[h][ls.mask], atol=1e-5, rtol=0)
            torch.testing.assert_close(ls.pattern(h), A[h], atol=1e-6, rtol=0)


def test_alpha_entmax_heads_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"need softmax heads.*alpha-entmax \(1\.5\).*log-normaliser") as e:
        bl.layer_scores(loaded(entmax_alpha=1.5), TOKENS, 0)
    assert "\n" not in str(e.value)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(list(KINDS)),
    layer=st.integers(0, 2),
    head=st.integers(0, 2),
    query=st.integers(0, 36),
    window=st.integers(1, 50),
    k=st.integers(1, 50),
    blocks=st.integers(1, 40),
    pool=st.sampled_from(bl.long.POOLS),
)
def test_long_view_equals_the_dense_matrices(kind, layer, head, query, window, k, blocks, pool):
    lm = loaded(**KINDS[kind])
    S, A = (m[head] for m in dense(lm, TOKENS, layer))
    v = bl.layer_scores(lm, TOKENS, layer).view(head, query, window=window, k=k, blocks=blocks, pool=pool)
    n = len(TOKENS)
    # the window: w consecutive positions that hold the query, ending at it unless it is early
    w = min(window, n)
    assert v.hi - v.lo + 1 == w and v.lo <= query <= v.hi
    assert v.hi == query or (v.lo == 0 and query < w)
    cut = S[v.lo : v.hi + 1, v.lo : v.hi + 1]
    torch.testing.assert_close(v.window_scores[v.window_mask], cut[v.window_mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(v.window_pattern, A[v.lo : v.hi + 1, v.lo : v.hi + 1], atol=1e-6, rtol=0)
    at = torch.arange(v.lo, v.hi + 1)
    near = at[:, None] - at[None, :] < (lm.config.window(layer) or n)
    assert torch.equal(v.window_mask, torch.ones(w, w, dtype=torch.bool).tril() & near)
    # the top-k keys: torch.topk of the query's whole visible row
    ref = torch.topk(A[query, : query + 1], min(k, int(v.row_mask.sum())))
    torch.testing.assert_close(torch.tensor(v.top["prob"].tolist()), ref.values, atol=1e-6, rtol=0)
    got, want = v.top["key"].tolist(), ref.indices.tolist()
    assert got == want or sorted(A[query, got].tolist()) == pytest.approx(sorted(A[query, want].tolist()), abs=1e-7)
    torch.testing.assert_close(torch.tensor(v.top["score"].tolist()), S[query, got], atol=1e-5, rtol=0)
    assert v.top["label"].tolist() == [v.labels[j] for j in got]
    # the overview: an independent tile-by-tile pooling of the dense matrices
    block = math.ceil(n / blocks)
    assert v.block == block and v.n_blocks == math.ceil(n / block) <= blocks
    seen = torch.ones(n, n, dtype=torch.bool).tril() & (
        (at_all := torch.arange(n))[:, None] - at_all < (lm.config.window(layer) or n)
    )
    torch.testing.assert_close(
        v.overview_pattern, pooled_by_loops(A, block, pool, seen), atol=1e-6, rtol=1e-5, equal_nan=True
    )
    torch.testing.assert_close(
        v.overview_scores, pooled_by_loops(S, block, pool, seen), atol=1e-5, rtol=1e-5, equal_nan=True
    )
    # the query's row, kept for its metrics
    torch.testing.assert_close(v.row_pattern, A[query], atol=1e-6, rtol=0)


def test_max_pooling_keeps_a_sharp_head_visible():
    # one key per query with weight 1: the mean over 8 x 8 tiles fades it, the max keeps 1.0
    n = 64
    A = torch.zeros(n, n)
    A[torch.arange(n), torch.arange(n) // 2] = 1.0
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    assert bl.pool_blocks(A, mask, 8, "max").nan_to_num(0).amax(-1).tolist() == [1.0] * 8
    assert bl.pool_blocks(A, mask, 8, "mean").nan_to_num(0).amax().item() <= 0.25


def test_the_forward_stops_after_the_needed_layer():
    lm = loaded()
    calls = []
    handles = [b.register_forward_hook(lambda m, i, o, l=l: calls.append(l)) for l, b in enumerate(lm.model.blocks)]
    try:
        bl.layer_scores(lm, TOKENS, 1)
        assert calls == [0]  # block 1 stopped inside its attention; block 2 never ran
        calls.clear()
        bl.layer_scores(lm, TOKENS, 0)
        assert calls == []
    finally:
        for h in handles:
            h.remove()
    # the model still works afterwards
    assert lm.model(torch.tensor([TOKENS])).shape == (1, 37, 12)


def test_dense_view_tables_equal_the_sequence_views():
    lm = resolve("induction-2l")
    tokens = bl.sample_tokens(lm, 0)
    ls = bl.layer_scores(lm, tokens, 1)
    seq = bl.sequence_view(lm, tokens, 1)
    assert ls.labels == seq.queries
    mine, theirs = ls.dense([2]).concentration_table(2), seq.concentration_table(2)
    theirs = theirs[theirs["head"] == 2].reset_index(drop=True)
    assert mine[["head", "metric"]].equals(theirs[["head", "metric"]])
    torch.testing.assert_close(
        torch.tensor(mine["mean"].values), torch.tensor(theirs["mean"].values), atol=1e-5, rtol=0
    )


def test_frames_describe_what_the_figures_draw():
    lm = loaded()
    v = bl.layer_scores(lm, TOKENS, 2).view(1, 30, window=5, k=4, blocks=8)
    wf = v.window_frame()
    assert len(wf) == 25 and wf["query"].min() == 26 and wf["key"].max() == 30
    assert wf["query_label"].iloc[0] == v.labels[26]
    of = v.overview_frame()
    assert len(of) == v.n_blocks**2 and of["key_last"].max() == 36
    row = of[(of["query_block"] == 1) & (of["key_block"] == 0)].iloc[0]
    assert (row["query_first"], row["query_last"]) == v.block_range(1) == (5, 9)


def test_hugging_face_gpt2_folder(tmp_path):
    write_tiny_gpt2(tmp_path)
    lm = resolve(tmp_path)
    tokens = list(range(3, 19)[:16])
    for layer in range(2):
        S, A = dense(lm, tokens, layer)
        v = bl.layer_scores(lm, tokens, layer).view(3, 11, window=6, k=3, blocks=4)
        torch.testing.assert_close(v.window_scores[v.window_mask], S[3, 6:12, 6:12][v.window_mask], atol=1e-5, rtol=0)
        assert v.top["key"].tolist() == torch.topk(A[3, 11, :12], 3).indices.tolist()
        assert v.labels[0] == "0:tok3"


def test_bad_inputs_get_one_line_errors():
    lm = loaded()
    ls = bl.layer_scores(lm, TOKENS, 0)
    for call, text in [
        (lambda: ls.view(3, 0), "head 3 is outside 0..2"),
        (lambda: ls.view(0, 37), "query 37 is outside 0..36"),
        (lambda: ls.view(0, 1.5), "query 1.5"),
        (lambda: ls.view(0, 0, window=0), "window must be an integer"),
        (lambda: ls.view(0, 0, k=True), "k must be an integer"),
        (lambda: ls.view(0, 0, blocks=0), "blocks must be"),
        (lambda: ls.view(0, 0, pool="median"), "pool must be one of max, mean"),
        (lambda: bl.layer_scores(lm, TOKENS, 3), "layer 3 is outside"),
        (lambda: bl.layer_scores(lm, [99], 0), "token id 99"),
    ]:
        with pytest.raises(ValueError, match=text.replace(".", r"\.")) as e:
            call()
        assert "\n" not in str(e.value)
    assert ls.view(0, -1).query == 36  # negative queries count from the end


def test_long_view_figures_export(tmp_path):
    import io
    import shutil
    import xml.etree.ElementTree as ET

    import pandas as pd

    from attn_core.figures import bilinear as fb
    from attn_core.figures import export_bytes

    v = bl.layer_scores(loaded(), TOKENS, 1).view(2, 30, window=8, k=5, blocks=10)
    plots = [fb.window_plot(v, "scores"), fb.window_plot(v, "pattern"), fb.top_keys_plot(v), fb.overview_plot(v)]
    assert [p.name for p in plots] == [
        "window_scores_L1H2_q30",
        "window_pattern_L1H2_q30",
        "topk_L1H2_q30",
        "overview_pattern_L1H2",
    ]
    for plot in plots:
        back = pd.read_csv(io.BytesIO(export_bytes(plot, "csv")))
        assert list(back.columns) == list(plot.data.columns) and len(back) == len(plot.data)
        assert b"Plotly.newPlot" in export_bytes(plot, "html")
    assert plots[0].data.loc[plots[0].data["highlighted"], "query"].unique().tolist() == [30]
    assert len(plots[3].fig.data[0].z) == v.n_blocks == 10  # 37 positions in 4 x 4 blocks
    if shutil.which("chromium"):
        assert export_bytes(plots[3], "png")[:8] == b"\x89PNG\r\n\x1a\n"
        assert ET.fromstring(export_bytes(plots[0], "svg")).tag.endswith("svg")


def test_a_long_token_does_not_squeeze_the_window_heatmap():
    """A 64-position window whose labels include a token of 16 spaces ("␣" each): the tick label
    is shortened (a run written once with its count) and the heatmap keeps its width; hover
    keeps the whole label (at full length it would leave the heatmap ~180 px of a 460 px chart)."""
    from attn_core.figures import bilinear as fb
    from attn_core.figures.layout import HALF_PX, short_tick

    v = bl.layer_scores(loaded(), TOKENS, 1).view(2, 30, window=64, k=5, blocks=10)
    long_label = "5:" + "␣" * 16
    v.labels = [long_label if i == 5 else s for i, s in enumerate(v.labels)]
    fig = fb.window_plot(v, "pattern").fig
    assert short_tick(long_label) == "5:␣×16" and "5:␣×16" in fig.layout.yaxis.ticktext
    m = fig.layout.margin
    assert HALF_PX - m.l - m.r >= 250, (m.l, m.r)
    assert any(long_label in str(h) for row in fig.data[0].hovertext for h in row)


def test_the_long_view_of_a_model_with_learned_sinks_keeps_each_heads_sink():
    """A head with a learned sink logit (gpt-oss): the pattern, the window, the top keys and the
    overview are the model's own A, whose rows sum to less than 1 (the rest is the sink's)."""
    lm = loaded(attn_sinks=True)
    with torch.no_grad():
        for block in lm.model.blocks:
            block.attn.sinks.copy_(torch.tensor([1.0, -2.0, 3.0]))
    S, A = dense(lm, TOKENS, 1)
    assert float(A[2].sum(-1).max()) < 0.9  # head 2's sink takes a real share
    ls = bl.layer_scores(lm, TOKENS, 1)
    for h in range(3):
        torch.testing.assert_close(ls.pattern(h), A[h], atol=1e-6, rtol=0)
        v = ls.view(h, 30, window=8, k=5, blocks=10)
        torch.testing.assert_close(v.window_pattern, A[h, 23:31, 23:31], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            torch.tensor(v.top["prob"].tolist()), torch.topk(A[h, 30], 5).values, atol=1e-6, rtol=0
        )
        torch.testing.assert_close(v.row_pattern, A[h, 30], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            v.overview_pattern, pooled_by_loops(A[h], v.block, "max"), atol=1e-6, rtol=0, equal_nan=True
        )


def test_al_long_view_is_the_one_engines_view():
    """``al.long_view``: the same LongView as ``layer_scores(...).view`` (a learned sink kept), a bad
    option refused in one sentence naming it, alpha-entmax refused."""
    import attn_core as al

    lm = loaded(attn_sinks=True)
    v = al.long_view(lm, TOKENS, layer=1, head=2, query=30, window=8, k=5)
    _, A = dense(lm, TOKENS, 1)
    torch.testing.assert_close(v.row_pattern, A[2, 30], atol=1e-6, rtol=0)
    assert (v.lo, v.hi, len(v.top)) == (23, 30, 5)
    with pytest.raises(ValueError, match="window must be an integer"):
        al.long_view(lm, TOKENS, layer=1, window=0)
    with pytest.raises(ValueError, match="alpha-entmax"):
        al.long_view(loaded(entmax_alpha=1.5), TOKENS)
    assert bl.blocked.longest_input(loaded(entmax_alpha=1.5, n_ctx=2048).model) <= bl.LONG_INPUT


def test_the_rows_table_of_every_head_is_the_dense_concentration():
    """``long.rows_table`` of the blocked rows: the entropy, normalized entropy and top-k mass of
    the dense concentration table, any length; the sink mass is token 0's weight."""
    lm = loaded()
    ls = bl.layer_scores(lm, TOKENS, 1)
    stats = [bl.blocked.row_stats(ls.qk, h, k=4) for h in range(3)]
    mine = bl.long.rows_table(stats, 1, k=3)
    dense_table = ls.concentration_table(3)
    for name in ("entropy", "normalized_entropy", "topk_mass"):
        a = mine[mine["metric"] == name].reset_index(drop=True)
        b = dense_table[dense_table["metric"] == name].reset_index(drop=True)
        assert a["head"].tolist() == b["head"].tolist() == [0, 1, 2]
        for col in ("mean", "min", "max"):
            torch.testing.assert_close(torch.tensor(a[col].values), torch.tensor(b[col].values), atol=1e-5, rtol=0)
    sink = mine[mine["metric"] == "sink_mass"]
    torch.testing.assert_close(
        torch.tensor(sink["max"].values),
        torch.stack([ls.pattern(h)[1:, 0].max() for h in range(3)]).double(),
        atol=1e-6,
        rtol=0,
    )
    with pytest.raises(ValueError, match="k must be an integer in 1..4"):
        bl.long.rows_table(stats, 1, k=5)

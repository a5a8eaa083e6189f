"""Metric names: MetricKey builds and parses every one (sigma:L0H1:3), round-trips, and refuses
garbage; the telemetry rows a job logs are named through it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import regularizers as R
from attn_core.tasks import get_task
from attn_core.training.telemetry import MetricKey, spectra_row, step_row, telemetry_row
from tests.conftest import make_tiny_model

TASK = get_task("reverse")

metrics = st.from_regex(r"[a-z_0-9]{1,12}", fullmatch=True)
small = st.integers(0, 10_000)
keys = st.one_of(
    st.builds(MetricKey, metrics),
    st.builds(MetricKey, metrics, small, small),
    st.builds(MetricKey, metrics, small, small, small),
)


@settings(max_examples=200, deadline=None)
@given(keys)
def test_a_key_round_trips_through_its_name(key):
    name = str(key)
    assert MetricKey.parse(name) == key
    assert MetricKey.try_parse(name) == key
    assert key.per_head == (key.layer is not None)


def test_the_names_of_the_metric_log():
    assert str(MetricKey("sigma", 0, 1, 3)) == "sigma:L0H1:3"
    assert str(MetricKey("stable_rank", 1, 2)) == "stable_rank:L1H2"
    assert str(MetricKey("loss")) == "loss"
    key = MetricKey.parse("entropy_data:L1H0")
    assert (key.metric, key.layer, key.head, key.index, key.head_label) == ("entropy_data", 1, 0, None, "L1H0")
    assert MetricKey("loss").head_label is None
    assert MetricKey.of_head("sigma", "L2H3", 4) == MetricKey("sigma", 2, 3, 4)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Sigma:L0H1",
        "sigma:L0",
        "sigma:H1",
        "sigma:L0H1:",
        "sigma:L0H1:2:3",
        "sigma:l0h1",
        "sigma:L-1H0",
        "term:entropy@L1",
        "sigma L0H1",
        "sigma:L0H1:x",
        ":L0H1",
        "sigma::L0H1",
        "sigma:L01H1",
        "sigma:L0H1:007",
    ],
)
def test_parse_refuses_garbage(name):
    with pytest.raises(ValueError, match="is not a metric name"):
        MetricKey.parse(name)
    assert MetricKey.try_parse(name) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20))
def test_parse_either_round_trips_or_refuses(text):
    key = MetricKey.try_parse(text)
    assert key is None or str(key) == text


def test_a_key_names_a_layer_and_a_head_together():
    for bad in (dict(layer=0), dict(head=1), dict(layer=0, index=2), dict(index=2)):
        with pytest.raises(ValueError, match="names a layer and a head together"):
            MetricKey("sigma", **bad)
    with pytest.raises(ValueError, match="integers >= 0"):
        MetricKey("sigma", -1, 0)
    with pytest.raises(ValueError, match="integers >= 0"):
        MetricKey("sigma", 0, True)
    with pytest.raises(ValueError, match="lower-case letters"):
        MetricKey("Sigma")
    with pytest.raises(ValueError, match="does not name a head"):
        MetricKey.of_head("sigma", "L0")


def test_logged_rows_parse_back():
    model = make_tiny_model(n_layers=2)
    cfg = model.cfg
    probe = TASK.sample(4, 0).tokens
    row = telemetry_row(model, probe, R.all_heads(cfg))
    per_head = [MetricKey.parse(n) for n in row if MetricKey.parse(n).per_head]
    # what the live pages draw: no vocabulary view (measured before and after only), no pattern
    assert {k.metric for k in per_head} == {"entropy_data", "top1_data"} and len(per_head) == 8
    assert {"entropy_data", "top1_data"} <= set(row) and "entropy_vocab" not in row
    spectra = spectra_row(R.head_spectra(model))
    sigma = [MetricKey.parse(n) for n in spectra if n.startswith("sigma:")]
    assert len(sigma) == 2 * 2 * 8 and {k.index for k in sigma} == set(range(8))
    assert spectra[str(MetricKey("stable_rank", 1, 1))] >= 1
    assert all(torch.isfinite(torch.tensor(list(spectra.values()))))
    # a step's penalty terms are logged as term:<label>, the trainer's own keys as they are
    assert step_row({"step": 3, "loss": 1.0, "task_loss": 0.9, "entropy@L1": 0.1}) == {
        "loss": 1.0,
        "task_loss": 0.9,
        "term:entropy@L1": 0.1,
    }

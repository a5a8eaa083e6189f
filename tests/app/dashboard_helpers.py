"""Reading the dashboard in AppTest: a chart's plotly JSON by its ui.show_plot key, and plotly's
data arrays (lists or base64 typed arrays) as tensors."""

import base64
import json
import math

import numpy as np
import torch
from streamlit.testing.v1 import AppTest


def open_page(path: str, model: str, timeout: float = 90) -> AppTest:
    """Run a page on ``model`` (picked through the URL, as a user's link would) and check that it
    rendered without an exception or an error message."""
    at = AppTest.from_file(path, default_timeout=timeout)
    at.query_params["model"] = model
    at.run()
    assert not at.exception and not at.error
    return at


def run_page(path: str, model: str, timeout: float = 120) -> AppTest:
    """Run a page on ``model`` (picked through the URL), whatever it shows: tests of its errors."""
    at = AppTest.from_file(path, default_timeout=timeout)
    at.query_params["model"] = model
    return at.run()


def widget(elements, label: str):
    """The widget of ``elements`` (``at.number_input``, ``at.selectbox``...) labelled ``label``."""
    return next(w for w in elements if w.label == label)


def chart(at: AppTest, key: str) -> dict:
    """The plotly figure drawn with ui.show_plot(..., key=key), as JSON."""
    found = [c for c in at.get("plotly_chart") if c.proto.id.endswith(f"-chart_{key}")]
    assert len(found) == 1, f"no single chart {key!r}"
    return json.loads(found[0].proto.spec)


def has_chart(at: AppTest, key: str) -> bool:
    return any(c.proto.id.endswith(f"-chart_{key}") for c in at.get("plotly_chart"))


def values(x) -> torch.Tensor:
    """A plotly data array: a list, or plotly's typed-array dict {dtype, bdata(, shape)}."""
    if isinstance(x, dict):
        arr = np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"]))
        shape = x.get("shape")
        return torch.from_numpy((arr.reshape([int(n) for n in str(shape).split(",")]) if shape else arr).copy()).float()
    return torch.tensor(x, dtype=torch.float32)


def z_matrix(fig: dict, trace: int = 0) -> torch.Tensor:
    """A heatmap's z with hidden cells (JSON null) as NaN."""
    z = fig["data"][trace]["z"]
    if isinstance(z, dict):
        return values(z)
    return torch.tensor([[math.nan if v is None else v for v in row] for row in z], dtype=torch.float32)

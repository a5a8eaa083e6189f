"""Every plotly figure of attn-lab, shared by the dashboard pages and the CLI's export.

Builders return a :class:`Plot` (a figure and the table it shows); one module per area:
``bilinear`` (scores, spectra, heads), ``training`` (retraining and runs), ``kernels``,
``grow``, ``toy``, ``qk`` (merged vs factored), ``sinks`` (attention sinks,
the sink-aware heatmap) and ``ranks`` (the two ranks of a head).
"""

from attn_core.figures.base import (
    EXPORT_FORMATS,
    ExportError,
    Plot,
    bundle_zip,
    export_bytes,
    write_plot,
)

__all__ = ["EXPORT_FORMATS", "ExportError", "Plot", "bundle_zip", "export_bytes", "write_plot"]

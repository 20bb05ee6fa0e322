"""Field trials, read back anywhere: traces, the run report (DSC Eq. 7 gains) and its plots.

``split-device run --trace`` writes a trace on the board; this package reads it, summarises
it and plots it. The plots need matplotlib, the ``report`` extra (``pip install
'splitedge[report]'``), so a board installs none; importing this package does not need it.
"""

from fieldtrial._plots import (
    plot_drop_rate,
    plot_latency_cdf,
    plot_latency_over_time,
    plot_measured_vs_model,
    plot_table,
)
from fieldtrial._report import format_summary, summarize, write_report
from fieldtrial._trace import Trace, load_trace, read_trace

__all__ = [
    "Trace",
    "format_summary",
    "load_trace",
    "plot_drop_rate",
    "plot_latency_cdf",
    "plot_latency_over_time",
    "plot_measured_vs_model",
    "plot_table",
    "read_trace",
    "summarize",
    "write_report",
]

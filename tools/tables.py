"""The cells of the markdown tables the tools print (tools.summarize, tools.compare_runs): one way to write a mean
over seeds."""

from __future__ import annotations

import numpy as np


def mean_se(values) -> str:
    """mean ± standard error over seeds ("-" if there is nothing, the bare mean for one seed)."""
    values = np.asarray(values)
    if len(values) == 0:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1) / np.sqrt(len(values)):.2f}"

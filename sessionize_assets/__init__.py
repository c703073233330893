"""sessionize_assets: sessions, daily aggregates and user attributes kept exact while events arrive late."""

__version__ = "0.1.0"

import warnings

# Two Dagster features this project relies on on purpose are marked beta in Dagster 1.13; their
# warnings would fill the UI's log on every code-server load (issue 16). Only these two are
# silenced; every other warning is shown.
warnings.filterwarnings(
    "ignore",
    message=r"Parameter `(backfill_policy|allow_nonexistent_upstream_partitions)` .* is currently in beta",
)

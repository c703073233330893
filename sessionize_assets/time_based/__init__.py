"""The time-based branch: tables, state (delta-rs), steps (Spark), assets (Dagster)."""

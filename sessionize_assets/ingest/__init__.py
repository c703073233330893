"""Ingest: landing files -> `events` / `invalid_events` (loader), the load-day fingerprints of `events` (load_days), and the assets that stand for them."""

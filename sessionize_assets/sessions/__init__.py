"""The session-based branch: tables, state (delta-rs), modes and steps (Spark), assets (Dagster).

`tables` (names and schemas) <- `state` (the manifest, delta-rs) <- `frames`, `changes`, `modes`
(Spark pieces) <- `steps` (one model's work) <- `run` (one run of every model) <- `assets` (the
multi-asset) <- `materialize` (the CLI's way in). Sensors and commands use `state`, `run`,
`steps` and `materialize`, never `assets`.
"""

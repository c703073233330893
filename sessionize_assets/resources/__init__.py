"""Dagster resources: the Spark + Delta session and the table locations."""

"""`sessionize demo`: generate a realistic data set, land it day by day, run the pipeline after each
load (as the sensors would), and print what happened: processed and skipped event days and why,
sessions that merged when late events arrived, and a final verification."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.errors import UserError

DEMO_START = dt.date(2024, 3, 1)  # the start of the settings below (the fixed replay tests use)


def demo_settings(start: dt.date) -> str:
    """The demo's settings file: small thresholds so late-day reprocessing shows on demo-sized
    data."""
    return (
        "# Written by `sessionize demo`: small thresholds so late-day reprocessing shows on\n"
        "# demo-sized data.\n"
        f"start_date: {start.isoformat()}\n"
        "min_rows_to_process: 25\n"
        "reprocess_days: 5\n"
        "session_mode: gap\n"
    )


DEMO_SETTINGS = demo_settings(DEMO_START)


def demo_start(now: dt.datetime, days: int) -> dt.date:
    """The demo's first load day: its last load day is the day before `now` (the real clock, or
    `--now` for a reproducible replay), so the UI shows it as recent, complete partitions."""
    return now.astimezone(dt.UTC).date() - dt.timedelta(days=days)


def load_day_now(day: dt.date, now: dt.datetime) -> dt.datetime:
    """When the demo processes load day `day`: 00:30 UTC the next day, never after `now`."""
    return min(dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0, 30), tzinfo=dt.UTC), now)


def _total(value) -> int:  # noqa: ANN001 - an int or a count per kind
    return sum(value.values()) if isinstance(value, dict) else int(value)


def _reset(ctx: CommandContext) -> None:
    """The demo owns its home: it starts from an empty warehouse, landing folder and instance."""
    home = ctx.home
    marker = home.root / ".sessionize-demo"
    has_data = (Path(home.warehouse)).exists() and any(Path(home.warehouse).iterdir())
    if has_data and not marker.exists():
        raise UserError(
            f"{home.root} holds data that the demo did not create; give the demo its own --home."
        )
    for folder in (Path(home.warehouse), home.landing, home.dagster_home):
        if folder.exists():
            shutil.rmtree(folder)
    home.ensure()
    marker.write_text("this home is owned by `sessionize demo`\n")


def superseded_lines(path: str, now: dt.datetime, examples: int = 2) -> list[str]:
    """What late events did to existing sessions in the run at `now` (superseded_sessions rows
    stamped with that run's time): counts by reason, and a few merges old ids -> new id."""
    from collections import Counter, defaultdict

    from sessionize_assets.resources.delta import read_small_table

    rows = [
        r
        for r in read_small_table(path)
        if r["superseded_at"] is not None and r["superseded_at"] == now
    ]
    if not rows:
        return ["Sessions changed by late events: none"]
    reasons = Counter(r["reason"] for r in rows)
    out = [
        "Sessions changed by late events: "
        + ", ".join(f"{n} superseded ({reason})" for reason, n in sorted(reasons.items()))
    ]
    merges: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r["reason"] == "merged":
            merges[r["session_identifier"]].append(r["superseded_session_identifier"])
    for new, old in list(merges.items())[:examples]:
        out.append(
            f"  merged into session {new[:8]}: {', '.join(o[:8] for o in sorted(old))} "
            "(late events closed the gap)"
        )
    return out


def run_demo(ctx: CommandContext) -> None:
    """The demo end to end on the embedded default (local Spark, local Delta warehouse)."""
    from sessionize_assets.generator import generate
    from sessionize_assets.ingest.assets import record_load
    from sessionize_assets.ingest.loader import load_paths
    from sessionize_assets.pipeline import run_pipeline, verify_pipeline
    from sessionize_assets.resources.tables import (
        EVENTS,
        INVALID_EVENTS,
        LOAD_LOG,
        SUPERSEDED_SESSIONS,
    )

    args = ctx.args
    _reset(ctx)
    start = demo_start(ctx.now, args.days)
    own_settings = ctx.home.root / "sessionize.yaml"
    if ctx.config_path is None or Path(ctx.config_path).resolve() == own_settings.resolve():
        # The demo owns its home: its settings follow its dates (last load day: yesterday).
        if not own_settings.exists() or own_settings.read_text().startswith("# Written by"):
            own_settings.write_text(demo_settings(start))
            ctx.reload_settings()
    landing = ctx.home.landing / "generated"
    summary = generate(
        landing,
        start_date=start,
        days=args.days,
        events_per_day=args.events_per_day,
        seed=args.seed,
        file_format="mixed",
        overwrite=True,
    )
    print(
        f"generated {summary.total_rows} rows over {args.days} load days in {landing} "
        f"({summary.late_rows} late, {_total(summary.duplicate_rows)} duplicates, "
        f"{_total(summary.malformed_rows)} malformed, {summary.bot_sessions} bot sessions)"
    )
    tables = {n: ctx.table(n) for n in (EVENTS, INVALID_EVENTS, LOAD_LOG)}
    for offset in range(args.days):
        day = start + dt.timedelta(days=offset)
        folder = landing / f"load_date={day.isoformat()}"
        now = load_day_now(day, ctx.now)
        print(f"\n=== load day {day} (now = {now:%Y-%m-%d %H:%M} UTC) ===")
        started = dt.datetime.now(dt.UTC)
        report = load_paths(
            ctx.spark, [folder], ctx.settings, tables, now, load_tstamp_from="load_tstamp"
        )
        record_load(ctx.instance, report, started)
        print(
            f"loaded {report.rows_read} rows: kept {report.rows_kept}, rejected {report.rows_invalid}"
        )
        for line in run_pipeline(ctx, now=now).lines():
            print(f"  {line}")
        for line in superseded_lines(ctx.table(SUPERSEDED_SESSIONS), now):
            print(f"  {line}")
    print("\n=== verify ===")
    differences, lines = verify_pipeline(ctx)
    for line in lines:
        print(f"  {line}")
    print(
        f"\nDemo home: {ctx.home.root}. Explore it with `sessionize --home {ctx.home.root} status` "
        f"or `bash scripts/dev.sh ui`."
    )
    if differences:
        raise UserError(f"verify found {len(differences)} difference(s) after the demo.")

"""One big incremental load day on a home the headline benchmark kept.

    python -m benchmarks.bigday --work /tmp/headline/work --events 1000000

`benchmarks.run --keep-work` leaves `homes/dNNN` (the history, its incremental day and its no-op
run). This generates one more load day of `--events` events (the same profile, another seed, so
its event ids are new) the day after the home's last (the harness's, or an earlier bigday's), then measures `load` + `run` of it on
that home the way the harness measures its incremental day (`benchmarks.measure`, the home's warm
engine started first and timed apart). It writes `bigday-<UTC time>-<N>.json` to `--out`: the
summary the harness reports per measurement, and the raw measurement. The tables are not compared
with DuckDB here (the harness's reference covers the history); `verify` can be run on the home
afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import yaml

from benchmarks import common
from benchmarks.run import stop_engine
from sessionize_assets.generator import generate
from sessionize_assets.resources import engine


def _setting(item: str) -> tuple[str, str]:
    """One `--spark-conf KEY=VALUE`, checked before anything is generated."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    return key.strip(), value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bigday", description=__doc__)
    parser.add_argument("--work", required=True, type=Path, help="the harness's --work folder")
    parser.add_argument("--home", default=None, help="home name under WORK/homes (default: dNNN)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1_000_003)
    parser.add_argument("--profile", default="realistic")
    parser.add_argument("--engine", choices=["off", "warm"], default="warm")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--timeout", type=float, default=5400)
    parser.add_argument(
        "--from-data",
        action="store_true",
        help="measure the data set's own next load day (a spare day `benchmarks.run "
        "--spare-days` generated with the history: returning users, late rows into earlier "
        "days) instead of generating a day of new users; --events, --seed and --profile are "
        "then the data set's",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="a Spark setting for this measurement (repeatable); with --engine warm it reaches "
        "the engine only when this measurement starts it (refused while the home's engine runs)",
    )
    parser.add_argument(
        "--keep-engine",
        action="store_true",
        help="leave the home's warm engine running (a next bigday then measures a warmed engine)",
    )
    args = parser.parse_args(argv)
    if args.keep_engine and args.engine != "warm":
        parser.error("--keep-engine needs --engine warm")

    work: Path = args.work
    homes = sorted(p for p in (work / "homes").glob("d[0-9][0-9][0-9]") if p.is_dir())
    home = work / "homes" / args.home if args.home else (homes[-1] if homes else None)
    if home is None or not home.is_dir():
        print(f"error: no kept benchmark home under {work / 'homes'}", file=sys.stderr)
        return 2
    running = engine.status(home).state == "running"
    if running and (args.spark_conf or args.engine == "off"):
        print(
            f"error: the home's engine runs already (a --keep-engine run left it), so "
            f"{'--spark-conf would not reach it' if args.spark_conf else '--engine off would share the machine with it'}; "
            f"stop it first: python -m sessionize_assets.resources.engine stop --home {home}",
            file=sys.stderr,
        )
        return 2
    configs = sorted((work / "configs").glob(f"{home.name}-incremental.yaml"))
    if not configs:
        print(f"error: no {home.name}-incremental.yaml under {work / 'configs'}", file=sys.stderr)
        return 2
    base = yaml.safe_load(configs[0].read_text())
    base.pop("spark", None)  # the event log is this measurement's own
    manifest = json.loads((work / "data" / "_manifest.json").read_text())
    # The day after the home's latest load day (a home a previous bigday extended included).
    # With --from-data, the home's own: the data set's later days are what is measured.
    known = _home_load_days(home / "warehouse" / "events")
    last = max(
        dt.date.fromisoformat(d)
        for d in (known if args.from_data else [*_load_days(work / "data"), *known])
    )
    day = last + dt.timedelta(days=1)
    started = time.perf_counter()
    if args.from_data:
        data = work / "data"
        if not (data / f"load_date={day.isoformat()}").is_dir():
            print(
                f"error: the data set has no load day {day} (its spare days are used up, or "
                "it was generated without --spare-days)",
                file=sys.stderr,
            )
            return 2
        args.events = int(manifest.get("events_per_day", args.events))
        args.profile = str(manifest.get("profile", args.profile))
        print(f"measuring the data set's load day {day} ({args.events} events a day)")
    else:
        data = work / f"bigday-{args.events}"
        print(f"generating load day {day}: {args.events} events ({args.profile}) into {data}")
        generate(
            data,
            start_date=day,
            days=1,
            events_per_day=args.events,
            seed=args.seed,
            file_format=manifest.get("file_format", "csv"),
            overwrite=True,
            profile=args.profile,
        )
    generation_s = time.perf_counter() - started
    settings = dict(base) | {"backfill_limit_days": int(base["backfill_limit_days"]) + 1}
    now = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(0, 30), tzinfo=dt.UTC)
    name = f"{home.name}-bigday-{args.events}"
    engine_log = work / "eventlogs" / f"{home.name}-engine" if args.engine == "warm" else None
    print(f"measuring load + run of {day} on {home}")
    raw = common.run_measurement(
        work,
        name,
        home,
        settings,
        dict(args.spark_conf),
        [
            common.load_step(now, [data / f"load_date={day.isoformat()}"]),
            common.step("run", now, "run"),
        ],
        data,
        args.timeout,
        engine_event_log_dir=engine_log,
    )
    if args.engine == "warm" and not args.keep_engine:
        stop_engine(home)
    elif args.keep_engine:
        print(
            "the engine keeps running; stop it with "
            f"python -m sessionize_assets.resources.engine stop --home {home}"
        )
    result = {
        "kind": "bigday",
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "parameters": vars(args) | {"work": str(work), "out": str(args.out), "home": str(home)},
        "load_day": day.isoformat(),
        # A warm engine that was running already (a --keep-engine run before this one).
        "engine_reused": running,
        "generation_s": round(generation_s, 1),
        "summary": common.summarize_measurement(raw),
        "raw": raw,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out / f"bigday-{stamp}-{args.events}.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    ok = bool(raw.get("ok"))
    print(f"{'ok' if ok else 'FAILED'}: wall {raw.get('command_wall_s')} s; written {out}")
    return 0 if ok else 1


def _load_days(data: Path) -> list[str]:
    return [p.name.split("=", 1)[1] for p in data.glob("load_date=*") if p.is_dir()]


def _home_load_days(events: Path) -> list[str]:
    """The load days of the home's `events` table (its partition values, from the Delta log)."""
    from sessionize_assets.resources.delta import add_actions

    _, actions = add_actions(str(events))
    return sorted({str(a["partition.load_date"])[:10] for a in actions if a["partition.load_date"]})


if __name__ == "__main__":
    raise SystemExit(main())

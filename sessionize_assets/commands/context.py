"""What every command needs: the home, the settings, now, and (lazily) Spark and Dagster."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionize_assets.home import Home
from sessionize_assets.settings import load_settings, parse_now, settings_file

if TYPE_CHECKING:
    from dagster import DagsterInstance, Definitions
    from pyspark.sql import SparkSession

    from sessionize_assets.lake import Lake

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


class CommandContext:
    """What every command needs: the home, the settings, now, and (lazily) Spark and Dagster."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.home = Home(Path(args.home).resolve() if args.home else Home.from_env().root)
        self.now = parse_now(args.now)
        self.config_path = settings_file(self.home.root, args.config)
        # Validated before any data is touched.
        self.settings = load_settings(self.home.root, args.config, today=self.now.date())
        self.args = args
        # With --json: the command's content, which the CLI prints as one JSON document.
        self.document: dict[str, Any] | None = None
        self._spark = None
        self._instance = None
        self._defs = None
        self._export_environment()

    @classmethod
    def within_run(
        cls, home: str, config: str | None, now: str | None, instance: DagsterInstance
    ) -> CommandContext:
        """A command's context inside a Dagster run (the UI's `refresh_job`): the run's home,
        settings file, clock and instance."""
        ctx = cls(argparse.Namespace(home=home, config=config, now=now))
        ctx._instance = instance
        return ctx

    def _export_environment(self) -> None:
        """The code server and run processes resolve the same settings from these."""
        os.environ["SESSIONIZE_HOME"] = str(self.home.root)
        if self.config_path:
            os.environ["SESSIONIZE_CONFIG"] = str(self.config_path)
        if self.args.now:
            os.environ["SESSIONIZE_NOW"] = self.now.isoformat()
        os.environ["DAGSTER_HOME"] = str(self.home.dagster_home)

    def reload_settings(self) -> None:
        """Resolve the settings again (after the demo writes its sessionize.yaml)."""
        self.config_path = settings_file(self.home.root, self.args.config)
        self.settings = load_settings(self.home.root, self.args.config, today=self.now.date())
        self._export_environment()
        self._defs = None

    def ensure_home(self) -> None:
        self.home.ensure()
        # The repository's dagster.yaml is the template of a home's instance file: copied once,
        # then the home's copy is the one users edit (never overwritten).
        target = self.home.dagster_home / "dagster.yaml"
        source = REPO_ROOT / "dagster.yaml"
        if source.is_file() and not target.is_file():
            shutil.copyfile(source, target)

    @property
    def lake(self) -> Lake:
        return self.lake_at(None)

    @property
    def spark(self) -> SparkSession:
        """The Spark session: the home's warm engine when one runs (`sessionize engine start`)
        and no other remote is configured, else the embedded engine of this process."""
        if self._spark is None:
            from sessionize_assets.resources.spark import get_spark

            self.use_running_engine()
            self._spark = get_spark(self.settings.spark)
        return self._spark

    def use_running_engine(self) -> str | None:
        """Point this process (and the Dagster runs it launches) at the home's running engine,
        unless a remote is configured already; the URL, or None (embedded engine)."""
        from sessionize_assets.resources import engine
        from sessionize_assets.resources.spark import REMOTE_SETTING, remote_url

        if REMOTE_SETTING in self.settings.spark or remote_url(self.settings.spark):
            return None
        url = engine.remote_url(self.home.root)
        if url is not None:
            os.environ["SESSIONIZE_SPARK_REMOTE"] = url
        return url

    @property
    def instance(self) -> DagsterInstance:
        if self._instance is None:
            from dagster import DagsterInstance

            from sessionize_assets.resources.dead_runs import mark_dead_runs_failed

            self.ensure_home()
            self._instance = DagsterInstance.get()
            mark_dead_runs_failed(self._instance)
        return self._instance

    @property
    def defs(self) -> Definitions:
        if self._defs is None:
            from sessionize_assets.definitions import build_definitions

            self._defs = build_definitions(self.home.root, self.args.config, self.now.isoformat())
        return self._defs

    def table(self, name: str) -> str:
        return self.home.table(name)

    def lake_at(self, now: dt.datetime | None = None) -> Lake:
        """The lake (without Dagster: `Lake.resource()` is the Dagster resource), with another
        `now` (e.g. a replayed day of the demo)."""
        from sessionize_assets.lake import Lake

        return Lake(
            home=str(self.home.root),
            config_file=str(self.config_path) if self.config_path else None,
            now=(now or self.now).isoformat(),
        )

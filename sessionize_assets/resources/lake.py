"""The lake resource: the home folder, the validated settings and "now", shared by every asset."""

from __future__ import annotations

import datetime as dt
from functools import cached_property
from pathlib import Path

from dagster import ConfigurableResource

from sessionize_assets.home import Home
from sessionize_assets.settings import Settings, load_settings, parse_now


class LakeResource(ConfigurableResource):
    """Where the tables are, which settings apply, and what time it is (injectable for replays).

    `home` is the `--home` folder; `config_file` the resolved settings file (or None for the
    spec's resolution order); `now` an ISO 8601 instant or None for the wall clock.
    """

    home: str
    config_file: str | None = None
    now: str | None = None

    @cached_property
    def home_folder(self) -> Home:
        return Home(Path(self.home))

    @cached_property
    def settings(self) -> Settings:
        today = self.current_time().date()
        return load_settings(Path(self.home), self.config_file, today=today)

    def current_time(self) -> dt.datetime:
        """Now, in UTC (the injected `now` when set)."""
        return parse_now(self.now)

    def table(self, name: str) -> str:
        """A Delta table's location in the warehouse."""
        return self.home_folder.table(name)

"""`sessionize load --by-load-date SOURCE…`: land a time-partitioned source folder window by
window, with a checkpointed cursor per source (seed 004: per-partition state, falling back to a
global cursor past `max_partitions` sources).

Each SOURCE holds one folder per load day (`load_date=YYYY-MM-DD` or `YYYY-MM-DD`). The cursor
`load` in `cursor_state` keeps, per source (its resolved path), the end of the last window
loaded; the next call starts there minus `lookback` (default P1D: a folder still being written
when the cursor passed it is listed again; files already loaded are skipped by content), and ends
at now. A window that loaded files is checkpointed before the next starts, so a failed call
resumes at its first unfinished window; windows without folders are passed without a Spark job.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionize_assets.core.clock import midnight
from sessionize_assets.core.cursor import (
    DEFAULT_MAX_PARTITIONS,
    CursorConfig,
    CursorState,
    Window,
    advance_state,
    finish_run,
    plan_slices,
    with_fallback,
)
from sessionize_assets.core.load_windows import folder_load_day, folders_in_window
from sessionize_assets.errors import UserError


def day_folders(source: Path) -> dict[dt.date, Path]:
    """The load-day folders of a source folder, by day (other entries are ignored)."""
    if not source.is_dir():
        raise UserError(f"{source} is not a folder; --by-load-date loads folders of load days.")
    out = {}
    for child in source.iterdir():
        day = folder_load_day(child.name) if child.is_dir() else None
        if day is not None:
            out[day] = child
    return out


@dataclass
class FolderLoadReport:
    """What one `load --by-load-date` did, window by window."""

    # (source, window, load days loaded in it)
    windows: list[tuple[str, Window, list[str]]] = field(default_factory=list)
    checkpoints: int = 0
    use_global_cursor: bool = False

    def lines(self) -> list[str]:
        out = [
            f"{source} {window}: load days {', '.join(days)}"
            for source, window, days in self.windows
        ] or ["No load-day folders between the cursor (minus the lookback) and now."]
        cursor = "global cursor" if self.use_global_cursor else "a cursor per source"
        out.append(f"cursor `load` ({cursor}) checkpointed {self.checkpoints} time(s)")
        return out


def load_by_load_date(
    sources: Sequence[Path],
    state: CursorState,
    load: Callable[[list[Path]], Any],
    checkpoint: Callable[[CursorState], Any],
    now: dt.datetime,
    lookback: str = "P1D",
    max_partitions: int = DEFAULT_MAX_PARTITIONS,
) -> tuple[CursorState, FolderLoadReport]:
    """Plan each source's windows from `state` to now and `load` the folders of each window."""
    folders = {str(source.resolve()): day_folders(source) for source in sources}
    report = FolderLoadReport()
    days = [day for by_day in folders.values() for day in by_day]
    if not days:
        return state, report
    config = CursorConfig(
        start=midnight(min(days)),
        step="P1D",
        lookback_window=lookback,
        max_partitions=max_partitions,
        align_to_start=True,  # windows are whole load days, whatever the cursor
    )
    keys = sorted(folders)
    prepared = with_fallback(config, state, keys)
    if prepared != state:
        checkpoint(prepared)
        report.checkpoints += 1
    state = prepared
    report.use_global_cursor = state.use_global_cursor
    pieces = plan_slices(config, state, now, keys)
    for i, piece in enumerate(pieces):
        sources_now = [piece.partition] if piece.partition is not None else keys
        batch = [f for key in sources_now for f in folders_in_window(folders[key], piece.window)]
        if batch:
            load(batch)
        state = advance_state(state, piece)
        last_of_source = i + 1 == len(pieces) or pieces[i + 1].partition != piece.partition
        if batch or last_of_source:
            checkpoint(state)
            report.checkpoints += 1
        if batch:
            report.windows.append(
                (
                    Path(sources_now[0]).name if len(sources_now) == 1 else "all sources",
                    piece.window,
                    [folder_load_day(f.name).isoformat() for f in batch],
                )
            )
    finished = finish_run(state)
    if finished != state:
        checkpoint(finished)
        report.checkpoints += 1
    return finished, report

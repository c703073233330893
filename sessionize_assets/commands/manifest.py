"""`sessionize manifest list/show/resolve/skip` and the manifest part of `sessionize status`.

Readers use delta-rs (no Spark); `resolve` and `skip` write through a `ProcessingManifest`.
Each function returns text (or rows) for the CLI to print; user mistakes raise `UserError`.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionize_assets.core.cursor import CursorState
from sessionize_assets.core.manifest_state import ItemState, ItemStatus, format_age
from sessionize_assets.errors import UserError
from sessionize_assets.resources.processing_manifest import (
    ProcessingManifest,
    item_state,
    item_states,
    utc_now,
)

_STATUS_ALIASES = {"failed": ItemStatus.FAIL_LOCKED, "fail_locked": ItemStatus.FAIL_LOCKED}
RESOLVE_HINT = "release with: sessionize manifest resolve ITEM --reason TEXT"
CursorRows = dict[str, tuple[CursorState, dict[str, Any]]]  # name -> (state, checkpoint row)


@dataclass(frozen=True)
class ItemRow:
    """One line of `manifest list`."""

    item_id: str
    status: str
    holder_run_id: str | None
    application: str | None
    age: str | None  # how long locked or fail-locked, e.g. "3h 12m"
    last_record_at: dt.datetime | None
    records: int
    reason: str | None

    @classmethod
    def of(cls, state: ItemState) -> ItemRow:
        last = state.last_record
        age = state.lock_age
        return cls(
            item_id=state.item_id,
            status=state.status.value,
            holder_run_id=state.holder_run_id,
            application=state.holder_application or (last.application if last else None),
            age=format_age(age) if age is not None else None,
            last_record_at=last.time if last else None,
            records=len(state.records),
            reason=state.reason,
        )


def parse_status(text: str | None) -> ItemStatus | None:
    """`--state` text -> ItemStatus (`failed` means fail-locked); None passes through."""
    if text is None:
        return None
    key = text.strip().lower()
    if key in _STATUS_ALIASES:
        return _STATUS_ALIASES[key]
    try:
        return ItemStatus(key)
    except ValueError:
        names = ", ".join(s.value for s in ItemStatus)
        raise UserError(f"Unknown manifest state {text!r}; use one of {names}.") from None


def manifest_states(
    path: str,
    state: str | ItemStatus | None = None,
    item_prefix: str | None = None,
    now: dt.datetime | None = None,
) -> list[ItemState]:
    """Items' derived states, by item id, optionally of one state or id prefix (what
    `manifest list` prints, as text or JSON)."""
    wanted = state if isinstance(state, ItemStatus) else parse_status(state)
    states = item_states(path, prefix=item_prefix, now=now or utc_now())
    return [s for s in states.values() if wanted is None or s.status is wanted]


def manifest_rows(
    path: str,
    state: str | ItemStatus | None = None,
    item_prefix: str | None = None,
    now: dt.datetime | None = None,
) -> list[ItemRow]:
    """Items with their derived state, by item id, optionally of one state or id prefix."""
    return [ItemRow.of(s) for s in manifest_states(path, state, item_prefix, now)]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines)


def list_items(
    path: str,
    state: str | None = None,
    item_prefix: str | None = None,
    now: dt.datetime | None = None,
) -> str:
    """`manifest list [--state S] [--item-prefix P]` as a text table."""
    return render_list(manifest_states(path, state=state, item_prefix=item_prefix, now=now))


def render_list(states: Sequence[ItemState]) -> str:
    """Items as the text table of `manifest list`."""
    rows = [ItemRow.of(s) for s in states]
    if not rows:
        return "No items in the processing manifest match."
    body = [
        [
            r.item_id,
            r.status,
            r.holder_run_id or "",
            r.age or "",
            r.last_record_at.isoformat(timespec="seconds") if r.last_record_at else "",
            str(r.records),
            r.reason or "",
        ]
        for r in rows
    ]
    return _table(["ITEM", "STATE", "RUN", "AGE", "LAST RECORD", "RECORDS", "REASON"], body)


def show_item(path: str, item: str, now: dt.datetime | None = None) -> str:
    """`manifest show ITEM`: the derived state, then every record in order."""
    return render_show(item_with_records(path, item, now))


def item_with_records(path: str, item: str, now: dt.datetime | None = None) -> ItemState:
    """An item's derived state and records; an item without records is a UserError."""
    state = item_state(path, item, now=now or utc_now())
    if not state.records:
        raise UserError(f"Item {item} has no records in the processing manifest.")
    return state


def render_show(state: ItemState) -> str:
    """An item as `manifest show` prints it: its state, then its records in order."""
    body = [
        [
            r.time.isoformat(timespec="microseconds"),
            r.state.value,
            r.application,
            r.run_id,
            r.record_id,
            r.previous_record_id or "",
            r.payload_json or "",
        ]
        for r in state.records
    ]
    headers = ["TIME", "STATE", "APPLICATION", "RUN", "RECORD", "PREVIOUS", "PAYLOAD"]
    return f"{_capitalized(state.describe())}.\n{_table(headers, body)}"


def resolve_item(manifest: ProcessingManifest, item: str, reason: str) -> str:
    """`manifest resolve ITEM --reason R`: a failure is resolved; a (stale) lock is abandoned
    first (Failed "abandoned"), then resolved. Returns what was done, as one sentence."""
    state = manifest.state(item)
    if state.status is ItemStatus.LOCKED:
        holder = state.holder_run_id
        manifest.abandon(item, reason=f"abandoned: {reason}", holder_run_id=holder)
        manifest.resolve(item, reason)
        return f"Abandoned the lock of run {holder} on item {item} and resolved it: {reason}."
    if state.status is ItemStatus.FAIL_LOCKED:
        manifest.resolve(item, reason)
        return f"Resolved the failure of run {state.holder_run_id} on item {item}: {reason}."
    raise UserError(f"{_capitalized(state.describe())}; there is nothing to resolve.")


def resolve_run(manifest: ProcessingManifest, run: str, reason: str) -> str:
    """`manifest resolve --run RUN --reason R`: every item of that run released at once."""
    done = manifest.resolve_run(run, reason)
    if not done:
        raise UserError(
            f"Run {run} holds no lock and left no failure; there is nothing to resolve."
        )
    items = ", ".join(sorted(done))
    return f"Released {len(done)} item(s) of run {run} ({items}): {reason}."


def skip_item(manifest: ProcessingManifest, item: str, reason: str) -> str:
    """`manifest skip ITEM --reason R`: no application touches the item again."""
    manifest.skip(item, reason)
    return f"Skipped item {item}: {reason}."


def manifest_status_lines(
    path: str, now: dt.datetime | None = None, item_prefix: str | None = None
) -> list[str]:
    """For `sessionize status`: counts by state, then every locked, fail-locked or invalid item
    with its holder run and age."""
    states = item_states(path, prefix=item_prefix, now=now or utc_now())
    return manifest_summary_lines(list(states.values()))


def needs_attention(states: Sequence[ItemState]) -> list[ItemState]:
    """The locked, fail-locked and invalid items (what `status` names)."""
    wanted = (ItemStatus.LOCKED, ItemStatus.FAIL_LOCKED, ItemStatus.INVALID)
    return [s for s in states if s.status in wanted]


def manifest_summary_lines(states: Sequence[ItemState]) -> list[str]:
    """`manifest_status_lines` of items already read."""
    counts = Counter(s.status for s in states)
    summary = ", ".join(f"{counts[s]} {s.value}" for s in ItemStatus if counts[s])
    lines = [f"processing manifest: {len(states)} items" + (f" ({summary})" if summary else "")]
    attention = needs_attention(states)
    for s in attention:
        age = f" for {format_age(s.lock_age)}" if s.lock_age is not None else ""
        holder = f" run {s.holder_run_id} ({s.holder_application}){age}" if s.holder_run_id else ""
        reason = f": {s.reason}" if s.status is not ItemStatus.LOCKED and s.reason else ""
        lines.append(f"  {s.status.value:<11} {s.item_id}{holder}{reason}")
    if any(s.status is not ItemStatus.INVALID for s in attention):
        lines.append(f"  ({RESOLVE_HINT})")
    return lines


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def cursor_status_lines(path: str) -> list[str]:
    """For `sessionize status`: cursors with a checkpointed position (e.g. an interrupted
    backfill, which the same command resumes), with the run that checkpointed it."""
    return cursor_lines(cursors_in_progress(path))


def cursors_in_progress(path: str) -> CursorRows:
    """Cursors with a checkpointed position, with their checkpoint row (cleared ones left out)."""
    from sessionize_assets.resources.cursor_store import read_cursor_states

    return {
        name: (state, row)
        for name, (state, row) in read_cursor_states(path).items()
        if state.global_cursor is not None or state.partitions
    }


def cursor_lines(cursors: CursorRows) -> list[str]:
    """`cursor_status_lines` of cursors already read."""
    lines = []
    for name, (state, row) in cursors.items():
        at = state.global_cursor.isoformat() if state.global_cursor else "per partition"
        lines.append(
            f"  {name}: done before {at} (checkpointed by run {row['run_id'] or '?'} at "
            f"{row['checkpoint_time']:%Y-%m-%d %H:%M:%S} UTC); running it again resumes there"
        )
    if not lines:
        return ["cursor checkpoints: none in progress"]
    return ["cursor checkpoints in progress:", *lines]

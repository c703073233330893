"""`refresh_job`: `sessionize refresh` from the UI (the Launchpad's config), under the command lock.

The same guarded work as the command: `yes: true` (or the setting allow_refresh) confirms it;
`models` names what to rebuild (empty: the session models); `from_day` restates from that day
under the settings that built the models (README.md, "Using it"; docs/deviations.md).
"""

# No `from __future__ import annotations`: Dagster reads the op's `config:` annotation as a type.
from pathlib import Path

from dagster import Config, Failure, OpExecutionContext, Output, job, op

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.commands.refresh import RefreshFailed, refresh
from sessionize_assets.errors import UserError
from sessionize_assets.resources.command_lock import command_lock
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import parse_day

REFRESH_JOB = "refresh_job"


class RefreshConfig(Config):
    """What `sessionize refresh MODEL… [--from DAY] [--yes]` takes."""

    models: list[str] = []
    from_day: str | None = None  # an ISO day, e.g. 2024-03-02
    yes: bool = False


@op(description="Rebuild or restate models (sessionize refresh), under the command lock.")
def refresh_models(
    context: OpExecutionContext, config: RefreshConfig, lake: LakeResource
) -> Output[list[str]]:
    try:
        day = parse_day(config.from_day, "from_day")
        with command_lock(Path(lake.home), "refresh (Dagster run)"):
            ctx = CommandContext.within_run(lake.home, lake.config_file, lake.now, context.instance)
            lines = refresh(ctx, config.models, config.yes, day)
    except (UserError, RefreshFailed) as exc:
        raise Failure(description=str(exc)) from None  # one sentence in the UI
    for line in lines:
        context.log.info(line)
    return Output(lines, metadata={"report": "\n".join(lines)})


@job(
    name=REFRESH_JOB,
    description="sessionize refresh from the UI: rebuild models after a settings change, or "
    "restate them from a day (from_day); needs yes: true unless allow_refresh is set.",
    tags={"sessionize/kind": "refresh"},
)
def refresh_job() -> None:
    refresh_models()

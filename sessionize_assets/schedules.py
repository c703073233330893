"""Table maintenance from Dagster: `table_maintenance_job` (the same work as `sessionize maintain`)
and a weekly schedule for it, off by default (README.md, "Using it")."""

# No `from __future__ import annotations`: Dagster reads the op's annotations (context, config,
# resources) as classes.
from pathlib import Path

from dagster import (
    Config,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)

from sessionize_assets.commands.maintenance import maintain_home
from sessionize_assets.errors import ItemLockedError, UserError
from sessionize_assets.resources.command_lock import command_lock
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource

TABLE_MAINTENANCE_JOB = "table_maintenance_job"
# Sunday 03:00 UTC: a quiet hour for most pipelines; VACUUM keeps a week of versions by default.
MAINTENANCE_CRON = "0 3 * * 0"
DEFAULT_VACUUM_HOURS = 168.0


class MaintainConfig(Config):
    """`vacuum_hours`: delete files unreferenced for this long (Delta's minimum is 168 unless the
    command lock is held, which it is here); null: compact only."""

    vacuum_hours: float | None = DEFAULT_VACUUM_HOURS


@op(
    description="OPTIMIZE the tables and VACUUM them (sessionize maintain), under the command lock."
)
def maintain_tables(
    context: OpExecutionContext,
    config: MaintainConfig,
    lake: LakeResource,
    spark: SparkDeltaResource,
) -> Output[list[str]]:
    # The home's command lock keeps `run`, `backfill` and a second maintenance out; a refusal
    # (a reader still needs the files) fails the run with the command's sentence.
    try:
        with command_lock(Path(lake.home), "maintain (Dagster run)"):
            lines = maintain_home(
                lake.home_folder,
                spark.get_session,
                config.vacuum_hours,
                lake.settings.key_columns(),
            )
    except (ItemLockedError, UserError) as exc:  # one sentence in the UI, not a traceback
        raise Failure(description=str(exc)) from None
    for line in lines:
        context.log.info(line)
    return Output(lines, metadata={"tables": len(lines), "report": "\n".join(lines)})


@job(
    name=TABLE_MAINTENANCE_JOB,
    description="Compact every table (filtered_events keeps its user-clustered files) and vacuum "
    "files no reader needs; refuses a retention that would break a change-feed reader.",
    tags={"sessionize/kind": "maintenance"},
)
def table_maintenance_job() -> None:
    maintain_tables()


def build_schedules(job_def: JobDefinition = table_maintenance_job) -> list[ScheduleDefinition]:
    """The weekly maintenance, STOPPED by default: it rewrites files under every table, so an
    operator turns it on knowingly (and picks the hour) rather than finding it running."""
    return [
        ScheduleDefinition(
            name="table_maintenance_schedule",
            job=job_def,
            cron_schedule=MAINTENANCE_CRON,
            execution_timezone="UTC",
            default_status=DefaultScheduleStatus.STOPPED,
            description="Weekly `sessionize maintain` (Sunday 03:00 UTC), off until turned on.",
        )
    ]

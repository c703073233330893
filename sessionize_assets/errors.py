"""Errors that are the user's to fix: the CLI prints them as one sentence and exits non-zero."""


class UserError(Exception):
    """A mistake the user can fix (bad setting, wrong path, missing set-up step)."""


class SettingsError(UserError):
    """A setting failed validation; the message names the key."""


class MissingJarsError(UserError):
    """The Delta Lake jars were not resolved during set-up."""


class ItemLockedError(UserError):
    """A processing-manifest item is locked, fail-locked or skipped."""

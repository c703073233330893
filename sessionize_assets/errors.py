"""Errors that are the user's to fix: the CLI prints them as one sentence and exits non-zero."""

import re


class UserError(Exception):
    """A mistake the user can fix (bad setting, wrong path, missing set-up step)."""


class SettingsError(UserError):
    """A setting failed validation; the message names the key."""


class MissingJarsError(UserError):
    """The Delta Lake jars were not resolved during set-up."""


class ItemLockedError(UserError):
    """A processing-manifest item is locked, fail-locked or skipped."""


def root_cause(exc: BaseException) -> BaseException:
    """The innermost error behind `exc`: Dagster's step errors wrap the user's exception
    (`user_exception`), Python chains others (`__cause__`)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "user_exception", None) or exc.__cause__
        if inner is None or not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def one_sentence(exc: BaseException, limit: int = 300) -> str:
    """An engine error (Spark, the JVM, delta-rs, Dagster) as one line: the root cause's kind and
    the first line of its message, without a stack."""
    cause = root_cause(exc)
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    kind = type(cause).__name__
    if kind == "BranchUnreadableError":  # already a sentence of ours
        return text
    if "status = StatusCode.UNAVAILABLE" in str(cause):  # a Spark Connect server went away
        details = re.search(r'details = "([^"]*)"', str(cause))
        text = (
            "The Spark Connect server stopped answering"
            + (f" ({details.group(1)})" if details else "")
            + "; `sessionize engine status` tells whether the home's warm engine still runs, and"
            " its log is <home>/engine/engine.log."
        )
        return text if len(text) <= limit else text[: limit - 1] + "…"
    sentence = f"{kind}: {text}" if text else kind
    return sentence if len(sentence) <= limit else sentence[: limit - 1] + "…"

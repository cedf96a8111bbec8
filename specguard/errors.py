"""One error hierarchy, grouped by what the caller should do about it.

- ``ConfigError``: permanent; the user must fix a file or a flag. Carries every issue at once.
- ``InputError``: a page, payload or response is malformed; the message names the place.
- ``SourceError``: temporary; an engine or Prometheus could not be reached or answered badly.
"""

from __future__ import annotations

from dataclasses import dataclass


class SpecguardError(Exception):
    """Base class: the CLI prints ``Error: <message>`` and exits non-zero, never a traceback."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config file, located by file, line, column and key path."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(SpecguardError):
    """A config file (or flag set) is invalid; ``issues`` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue | str):
        if isinstance(issues, str):
            issues = [ConfigIssue("<config>", None, None, "", issues)]
        elif isinstance(issues, ConfigIssue):
            issues = [issues]
        self.issues: list[ConfigIssue] = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


class InputError(SpecguardError):
    """Malformed input (metrics page, response body, webhook payload); says what and where."""


class SourceError(SpecguardError):
    """A data source (engine, Prometheus, Kubernetes API) failed; retrying later may succeed."""


class UnreachableError(SourceError):
    """Nothing answered at the address: connection refused, no route, or the connect timed out.

    Unlike a slow or malformed answer, this says the server is not serving at all (failover)."""


class NotReadyError(SourceError):
    """The server answered 503 Service Unavailable: it listens but does not serve yet (a
    llama.cpp server loading its model) or any more (draining). As good as down for routing."""

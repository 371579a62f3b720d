"""Errors the SDK raises, each with a message a person can act on.

Every error is a :class:`~gpupool.domain.errors.GpupoolError`, so the CLI prints it as one line.
``ApiError`` carries the server's problem+json answer: ``status`` (HTTP), ``title`` (the kind of
error) and ``detail`` (what is wrong and what to do). ``exit_code`` is the CLI's exit status for
the error (see :mod:`gpupool.cli.session`).
"""

from __future__ import annotations

from gpupool.domain.errors import GpupoolError

#: CLI exit codes, one per kind of failure (0 is success, 1 a job that failed).
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_NOT_FOUND = 3
EXIT_DENIED = 4
EXIT_UNREACHABLE = 5
EXIT_CONFLICT = 6
EXIT_SERVER = 7
EXIT_TIMEOUT = 8


class ClientError(GpupoolError):
    """Base of the SDK's errors; ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT_FAILED


class ConfigError(ClientError):
    """No server or token could be found, or the config file is unreadable."""

    exit_code = EXIT_INVALID


class ServerUnreachable(ClientError):
    """The server did not answer (refused, timed out, DNS)."""

    exit_code = EXIT_UNREACHABLE


class LogsUnavailable(ClientError):
    """The job's logs are not on this machine (the server does not serve logs yet)."""

    exit_code = EXIT_NOT_FOUND


class WaitTimeout(ClientError):
    """``Client.wait`` gave up before the job ended."""

    exit_code = EXIT_TIMEOUT


class ApiError(ClientError):
    """The server answered with an error (problem+json)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        if self.status in (400, 422):
            return EXIT_INVALID
        if self.status == 404:
            return EXIT_NOT_FOUND
        if self.status in (401, 403):
            return EXIT_DENIED
        if self.status == 409:
            return EXIT_CONFLICT
        if self.status >= 500:
            return EXIT_SERVER
        return EXIT_FAILED

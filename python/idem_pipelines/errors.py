"""One exception class per exit code of the `idem` binary (docs/cli.md, "Exit codes").

Only `RunFailed` (exit code 1) and `Interrupted` (130) are worth retrying: the others
fail the same way on the same input.
"""

from __future__ import annotations

from typing import Any


class IdemError(Exception):
    """A failed idem command.

    Attributes:
        message: the error idem printed, naming the job file, source, partition or
            table it is about.
        exit_code: the binary's exit code.
        partition: the partition the error names, when it names one.
        command: the command that failed.
        stderr: everything the binary printed on stderr.
        report: what the command reported before failing (a `VerifyReport`, or a
            backfill's events), if anything.
    """

    #: Whether running the same command again may succeed.
    retryable = False
    exit_code_of_class: int | None = None

    def __init__(
        self,
        message: str,
        *,
        exit_code: int,
        partition: str | None = None,
        command: list[str] | None = None,
        stderr: str = "",
        report: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.partition = partition
        self.command = command or []
        self.stderr = stderr
        self.report = report

    def __str__(self) -> str:
        return self.message


class RunFailed(IdemError):
    """Exit code 1: reading, writing or committing failed (I/O, the store, contention
    with another writer, memory). Every partition was left old or new; a retry may
    succeed."""

    retryable = True
    exit_code_of_class = 1


class BadInput(IdemError):
    """Exit code 2: the arguments, the job file, its SQL, a source file or a layout
    rule are wrong; nothing was written."""

    exit_code_of_class = 2


class CheckFailed(IdemError):
    """Exit code 3: a check on the staged output failed; nothing was published and the
    live partitions are as they were."""

    exit_code_of_class = 3


class NotDeterministic(IdemError):
    """Exit code 4: `verify` found that two runs of the same date differ (`report`
    holds the `VerifyReport`)."""

    exit_code_of_class = 4


class DataError(IdemError):
    """Exit code 5: the transform failed on the date's data (a cast that does not fit,
    a division by zero); nothing was published."""

    exit_code_of_class = 5


class Interrupted(IdemError):
    """Exit code 130: the run was interrupted (a second Ctrl-C); every partition is
    old or new."""

    retryable = True
    exit_code_of_class = 130


_BY_CODE = {
    cls.exit_code_of_class: cls
    for cls in (
        RunFailed,
        BadInput,
        CheckFailed,
        NotDeterministic,
        DataError,
        Interrupted,
    )
}


def error_for(code: int, message: str, **kwargs: Any) -> IdemError:
    """The exception of exit code `code`. A process killed by a signal (a negative
    code from `subprocess`) is a `RunFailed`: retrying it is safe."""
    cls = _BY_CODE.get(code, RunFailed if code < 0 or code > 128 else IdemError)
    return cls(message, exit_code=code, **kwargs)

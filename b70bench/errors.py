"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UsageError(Exception):
    """Bad input or an unusable machine. The message names the problem and the fix."""

    exit_code = 2


class Unavailable(Exception):
    """A suite, variant or size that cannot run on this machine; the message is the reason.

    asv adapters turn this into NotImplementedError (asv's skip); the CLI prints it as a
    skipped row. It is never an error of the run as a whole.
    """

"""Exit codes of `thornctl` and the one exception its commands raise to fail cleanly.

The codes follow BSD ``sysexits.h`` where one fits, so scripts can tell "fix your file"
from "the server said no" from "the server is not there".
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    REFUSED = 1  # the server refused the request (4xx): the API's `detail` is printed
    USAGE = 2  # bad command line (Click's own code)
    DATAERR = 65  # EX_DATAERR: an input file cannot be parsed (bad JSON/YAML, not UTF-8)
    NOINPUT = 66  # EX_NOINPUT: an input file does not exist or cannot be read
    UNAVAILABLE = 69  # EX_UNAVAILABLE: cannot connect, timed out, or the server failed (5xx)
    CANTCREAT = 73  # EX_CANTCREAT: an output file cannot be written
    TEMPFAIL = 75  # EX_TEMPFAIL: a --wait ran out of time (it may still finish), or a 429
    PROTOCOL = 76  # EX_PROTOCOL: the answer is not THORN's JSON (wrong --url?)
    NOPERM = 77  # EX_NOPERM: 401 (missing, wrong or revoked token) or 403 (role too weak)


class CliError(Exception):
    """A failure to report as one line on stderr (never a traceback) and exit with `code`."""

    def __init__(
        self, message: str, code: ExitCode = ExitCode.REFUSED, *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status  # the HTTP status, when the server answered

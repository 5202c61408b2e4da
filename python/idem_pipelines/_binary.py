"""Finding the `idem` binary: the one this package's wheel installed, else `IDEM_BIN`,
else the first `idem` on the PATH."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

_NAME = "idem.exe" if sys.platform == "win32" else "idem"


def find_idem(idem_bin: str | None = None) -> str:
    """The path of the `idem` binary this module drives.

    `idem_bin` (a path, or a name on the PATH) wins when given, then `IDEM_BIN` (a
    build from source, say); then the binary the wheel put in this environment's
    scripts directory (or the user's, for `pip install --user`); then the first `idem`
    on the PATH.

    Raises:
        FileNotFoundError: when there is none.
    """
    for source, explicit in (
        ("idem_bin", idem_bin),
        ("IDEM_BIN", os.environ.get("IDEM_BIN")),
    ):
        if explicit:
            found = explicit if os.path.isfile(explicit) else shutil.which(explicit)
            if not found:
                raise FileNotFoundError(
                    f"{source} is {explicit!r}, which is not a file"
                )
            return found
    candidates = [sysconfig.get_path("scripts")]
    user_scheme = {"nt": "nt_user", "posix": "posix_user"}.get(os.name)
    if user_scheme and user_scheme in sysconfig.get_scheme_names():
        candidates.append(sysconfig.get_path("scripts", scheme=user_scheme))
    for directory in candidates:
        path = os.path.join(directory, _NAME)
        if os.path.isfile(path):
            return path
    found = shutil.which("idem")
    if found:
        return found
    raise FileNotFoundError(
        "no idem binary: install the idem-pipelines wheel, put idem on the PATH, "
        "or set IDEM_BIN"
    )

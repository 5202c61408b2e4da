"""`python -m idem_pipelines ARGS`: runs the `idem` binary with ARGS."""

from __future__ import annotations

import os
import subprocess
import sys

from ._binary import find_idem


def main() -> None:
    idem = find_idem()
    if sys.platform == "win32":
        sys.exit(subprocess.call([idem, *sys.argv[1:]]))
    os.execv(idem, [idem, *sys.argv[1:]])


if __name__ == "__main__":
    main()

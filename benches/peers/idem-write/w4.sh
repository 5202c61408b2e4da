#!/bin/bash
# W4: every merge already writes (the harness starts each from a fresh table).
exec "$(dirname "$0")/../idem/w4.sh" "$@"

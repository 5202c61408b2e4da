#!/bin/bash
# W5 written in full every time (--rewrite): staged, encoded, uploaded and committed
# even when the rows equal the live ones.
IDEM_W5_FLAGS=--rewrite exec bash "$(dirname "$0")/../idem/w5.sh" "$@"

#!/bin/bash
# W6 written in full every time (--rewrite).
IDEM_W6_FLAGS=--rewrite exec bash "$(dirname "$0")/../idem/w6.sh" "$@"

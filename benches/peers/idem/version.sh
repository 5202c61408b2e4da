#!/bin/bash
source "$(dirname "$0")/_common.sh"
"$IDEM" --version

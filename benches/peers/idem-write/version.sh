#!/bin/bash
source "$(dirname "$0")/../idem/_common.sh"
echo "idem-write $("$IDEM" --version | awk '{print $NF}')"

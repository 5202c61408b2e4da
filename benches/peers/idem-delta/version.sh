#!/bin/bash
source "$(dirname "$0")/../idem/_common.sh"
echo "idem-delta $("$IDEM" --version | awk '{print $NF}')"

#!/bin/bash
source "$(dirname "$0")/../../../peers/idem/_common.sh"
echo "idem $("$IDEM" --version | awk '{print $NF}')"

#!/usr/bin/env bash
# The README's first command: installs what building vcdn needs
# (scripts/deps.sh), then builds and runs `vcdn up` with its embedded
# defaults (--demo adds a demo origin and customer). Arguments go to
# `vcdn up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
exec cargo run --release -p vcdn -- up "$@"

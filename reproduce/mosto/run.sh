#!/usr/bin/env bash
# reproduce/mosto/run.sh - MOSTO's Fig. 3 and runtime claim (JSAC 2017, §V-A)
# with vcdn_policy::chains on the topologies of shared/data/topologies.
# Pure computation, one core, a few seconds in release.
#
# Environment (defaults): TOPOLOGIES=<repo>/../shared/data/topologies
#   (else /work/shared/data/topologies)  OUT=reproduce/mosto
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOPOLOGIES=${TOPOLOGIES:-$ROOT/../shared/data/topologies}
[ -d "$TOPOLOGIES" ] || TOPOLOGIES=/work/shared/data/topologies
OUT=${OUT:-$ROOT/reproduce/mosto}
cd "$ROOT"
cargo build --release -q -p vcdn-reproduce --bin mosto
./target/release/mosto --topologies "$TOPOLOGIES" --out "$OUT"

#!/usr/bin/env bash
# Scale-out reaction time, telemetry against polling (issue 19, point 5):
# time from a step of 40 viewers' connections on a fresh elastic service's
# one cache to the supervisor's scale-out decision (the scaled_out event's
# time less the launch it reports), three steps (paris, lyon, marseille)
# with `vcdn up --no-stats-polling` (telemetry alone), then three with
# telemetry off (polling alone), in one run of the test
# `the_supervisor_scales_out_from_telemetry_alone_with_polling_off`.
#
#   bench/telemetry-scaling.sh [RUNS]     # default 3 runs, release build
#
# Run it on a quiet machine: each figure is a few hundred milliseconds,
# and another build on the same cores moves it.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cargo build --release -p vcdn --tests >/dev/null
for _ in $(seq "$runs"); do
    cargo test --release -p vcdn --test telemetry \
        the_supervisor_scales_out_from_telemetry_alone_with_polling_off -- --nocapture 2>&1 |
        grep "scale-out decision"
done

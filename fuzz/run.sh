#!/usr/bin/env bash
# Run every fuzz target in turn and print one summary line each.
#
#   fuzz/run.sh                      # every target, FUZZ_SECONDS (60) each
#   fuzz/run.sh request_head chunked # only these targets
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_TOOLCHAIN  rustup toolchain (default nightly; cargo-fuzz needs it)
#   FUZZ_FEATURES   cargo features of the fuzz crate (none at present)
#   FUZZ_ARGS       extra libFuzzer flags, e.g. "-max_len=20000"
#
# Targets run one after another, single process each (no -jobs/-fork, so
# libFuzzer writes no fuzz-N.log into the working directory). New inputs go to
# fuzz/corpus/<target>, the committed seeds in fuzz/seeds/<target> are only
# read, crashes go to fuzz/artifacts/<target>, full logs to fuzz/artifacts/logs.
# Exits non-zero if any target failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${FUZZ_SECONDS:-60}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
features="${FUZZ_FEATURES:-}"
read -r -a extra_args <<<"${FUZZ_ARGS:-}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found; installing it"
    cargo install cargo-fuzz --locked
fi

feature_args=()
if [[ -n "$features" ]]; then
    feature_args=(--features "$features")
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo "+$toolchain" fuzz list)
fi

cargo "+$toolchain" fuzz build "${feature_args[@]}"

log_dir=fuzz/artifacts/logs
mkdir -p "$log_dir"
summary=()
failed=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
    log="$log_dir/$t.log"
    echo "== $t: fuzzing for ${seconds}s (log: $log)"
    rc=0
    cargo "+$toolchain" fuzz run "${feature_args[@]}" "$t" \
        "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 "${extra_args[@]}" \
        >"$log" 2>&1 || rc=$?

    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n1 || true)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$log" | tail -n1 || true)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2 || true)
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    if [[ $rc -eq 0 ]]; then
        status=ok
    else
        failed=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1 || true)
        status="FAILED (exit $rc${artifact:+, input: $artifact})"
        grep -m1 -A3 "panicked at" "$log" || tail -n 20 "$log"
    fi
    line=$(printf '%-14s execs=%-10s execs/s=%-8s cov=%-6s corpus=%-6s %s' \
        "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corpus" "$status")
    echo "$line"
    summary+=("$line")
done

echo
echo "== summary (${seconds}s per target${features:+, features: $features})"
printf '%s\n' "${summary[@]}"
exit "$failed"

#!/usr/bin/env bash
# Runs every cargo-fuzz target for a while and reports one line per target.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS is the time per target (default 30); TARGETs default to every target in
# fuzz/fuzz_targets. Each target starts from its seed corpus in fuzz/corpus/<target> (read,
# never written) and grows a working corpus in fuzz/work/<target>. A crash, a failed assertion
# or a hang leaves its input in fuzz/artifacts/<target>/ and makes the script exit 1 once every
# target has run. Needs a nightly toolchain; cargo-fuzz is installed if missing.
set -euo pipefail

cd "$(dirname "$0")/.."

seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
    echo "usage: $0 [SECONDS] [TARGET...]" >&2
    exit 2
fi
shift || true

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# Build every target first so that build time is not taken from the fuzzing time.
cargo +nightly fuzz build >&2

mkdir -p fuzz/work/logs
failed=0
for target in "${targets[@]}"; do
    if [ ! -f "fuzz/fuzz_targets/$target.rs" ]; then
        echo "$target: no such target" >&2
        failed=1
        continue
    fi
    work="fuzz/work/$target"
    log="fuzz/work/logs/$target.log"
    mkdir -p "$work" "fuzz/corpus/$target" "fuzz/artifacts/$target"
    # 4096 bytes covers a full frame slot and memcached's longest non-get line twice over; a
    # single input taking 10 s is reported as a hang.
    status=0
    cargo +nightly fuzz run "$target" "$work" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1 || status=$?

    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
    corpus=$(find "$work" -type f | wc -l)
    if [ "$status" -eq 0 ]; then
        result="ok"
    else
        failed=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        # A Rust panic prints its location, then its message on the next line.
        reason=$(grep -m1 -A1 "panicked at" "$log" | tr '\n' ' ' || true)
        if [ -z "$reason" ]; then
            reason=$(grep -m1 -E "ERROR: (libFuzzer|AddressSanitizer)" "$log" || true)
        fi
        result="FAILED (exit $status) ${artifact:-see $log}: ${reason:-see $log}"
    fi
    printf '%-18s %10s execs  cov %6s  corpus %5s  %ss  %s\n' \
        "$target" "${execs:-?}" "${cov:-?}" "$corpus" "$seconds" "$result"
done

exit "$failed"

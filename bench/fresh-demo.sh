#!/bin/bash
# A newcomer's first command on a fresh machine (bench/results/first-build.txt): a clean clone, an
# empty cargo home (every crate downloaded again), no protoc on the machine; prints each line of
# the demo with the seconds since the clone began.
#
#   bench/fresh-demo.sh [REV]   REV: a commit of the repository this script sits in (default main)
set -u
rev=${1:-main}
repo=$(cd "$(dirname "$0")/.." && pwd)
root=$(mktemp -d /tmp/fresh-demo.XXXXXX)
export CARGO_HOME=$root/cargo-home
unset PROTOC
command -v protoc >/dev/null && echo "warning: protoc is installed here; a fresh machine has none"
start=$(date +%s.%N)
since() { echo "$(date +%s.%N) - $start" | bc; }
git clone -q "$repo" "$root/stela" && cd "$root/stela" && git checkout -q "$rev"
echo "clone done: $(since) s"
cargo run --release -- demo 2>"$root/build.err" | while IFS= read -r line; do
  printf '%8.1f s  %s\n' "$(since)" "$line"
done
echo "exit: ${PIPESTATUS[0]}"
echo "total: $(since) s"
echo "crates compiled: $(grep -c Compiling "$root/build.err")"
grep -E "^error|protoc" "$root/build.err" | head
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(left in $root)"

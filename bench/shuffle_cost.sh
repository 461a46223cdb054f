#!/bin/sh
# shuffle_cost.sh - what the shuffled split order costs through the service
# (dispatcher_ledger.c, "shuffled order"): W1's shape through a dispatcher
# and 2 workers (--threads 1 each) over ipc://, without a shuffle (its
# splits and their order must be unchanged) and with shuffle(100000) over
# range(10^6) (cut into 1,024 splits in a seeded order instead of 16 in
# order). Interleaves builds given as arguments (A/B on the same load),
# REPS times each; prints one line per run: build, case, client wall
# seconds, elements/s, and the CPU seconds of the client, the workers and
# the dispatcher together (/proc/<pid>/stat utime+stime of the daemons,
# /usr/bin/time of the client). Every daemon it started is stopped by pid.
#
# usage: bench/shuffle_cost.sh BUILD_DIR [BUILD_DIR...]   (REPS=3)
set -eu
REPS=${REPS:-3}
N=${N:-1000000}
tmp=$(mktemp -d /tmp/shuffle_cost.XXXXXX)
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

cpu_of() { # utime + stime of pid, in clock ticks
	awk '{print $14 + $15}' "/proc/$1/stat"
}

run_one() { # build case pipeline
	b=$1; case_=$2; p=$3; d=$tmp/$$.$case_
	rm -rf "$d"; mkdir -p "$d"
	"$b/cachewd" --role=dispatcher --listen "ipc://$d/d" \
	    --heartbeat-ms 100 >"$d/d.log" 2>&1 &
	dp=$!; pids="$pids $dp"
	i=0; while [ ! -S "$d/d" ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
	"$b/cachewd" --role=worker --dispatcher "ipc://$d/d" \
	    --listen "ipc://$d/w1" --threads 1 --heartbeat-ms 100 \
	    >"$d/w1.log" 2>&1 &
	w1=$!; pids="$pids $w1"
	"$b/cachewd" --role=worker --dispatcher "ipc://$d/d" \
	    --listen "ipc://$d/w2" --threads 1 --heartbeat-ms 100 \
	    >"$d/w2.log" 2>&1 &
	w2=$!; pids="$pids $w2"
	i=0
	while [ "$(grep -c registered "$d/w1.log" "$d/w2.log" |
	    awk -F: '{s += $2} END {print s}')" -lt 2 ] && [ $i -lt 250 ]; do
		sleep 0.02; i=$((i+1))
	done
	c0=$(( $(cpu_of $dp) + $(cpu_of $w1) + $(cpu_of $w2) ))
	CACHEW_SERVICE="ipc://$d/d" /usr/bin/time -f "%U %S" -o "$d/time" \
	    "$b/cachew" run --json "$p" >"$d/out" 2>"$d/err"
	c1=$(( $(cpu_of $dp) + $(cpu_of $w1) + $(cpu_of $w2) ))
	kill $w1 $w2 $dp 2>/dev/null || true
	wait $w1 $w2 $dp 2>/dev/null || true
	pids=""
	tick=$(getconf CLK_TCK)
	awk -v b="$b" -v c="$case_" -v dc=$((c1 - c0)) -v tick="$tick" \
	    -v t="$(cat "$d/time")" '
	    { match($0, /"seconds":[0-9.]+/); s = substr($0, RSTART + 10, RLENGTH - 10)
	      match($0, /"elements_per_s":[0-9.]+/); r = substr($0, RSTART + 17, RLENGTH - 17)
	      split(t, u, " ")
	      printf "%s %s wall=%.3fs rate=%.0f/s cpu=%.2fs\n", b, c, s, r,
	          u[1] + u[2] + dc / tick }' "$d/out"
}

for rep in $(seq 1 "$REPS"); do
	for b in "$@"; do
		run_one "$b" plain "range($N) | map(add, value=1) | batch(64)"
		run_one "$b" shuffle \
		    "range($N) | map(add, value=1) | shuffle(100000, seed=1) | batch(64)"
	done
done

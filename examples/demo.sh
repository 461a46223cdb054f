#!/bin/sh
# demo.sh - the cachew demo; `make demo` runs `sh examples/demo.sh build`.
#
# Runs three pipelines with the `cachew` command and shows what they did:
#   1. the main job, ImageNet-like: TFRecord shards of tf.train.Example
#      with 500x375 JPEGs (made once by `cachew gen imagenet` under
#      <build>/demo-data/imagenet), parsed, decoded and randomly cropped in
#      one fused step, flipped, normalised, batched by 64 and prefetched;
#   2. ten million numbers, each plus one (a parallel, autotuned map),
#      batched by 64 and prefetched;
#   3. a text job: a small generated corpus (8 files x 50,000 lines of
#      pseudo-random words, made once under <build>/demo-data with a fixed
#      seed) read by several files at a time, batched and prefetched;
#   4. the C training loop (examples/train_loop.c, a fake 20 ms model
#      step per batch) on the main job, once in-process and once against a
#      dispatcher and two workers (cachewd on loopback) by changing only
#      the environment (CACHEW_SERVICE), with the throughput of each;
#   5. autoscaling: a dispatcher that starts its own workers (the process
#      provisioner) and an I/O-bound job (2 ms of sleep per element, a
#      consumer 4x faster than one worker): the `model` policy's decisions
#      from the events log as they come (the pool every 3 s meanwhile), the
#      count it settled on, then autocaching over four epochs; at the end
#      each of its jobs drawn by `cachew plot` (workers, throughput, client
#      wait and cache mode over time: <build>/demo-data/plots/job-N.png).
# On a terminal each run shows a live progress line; then the per-operator
# counters (--stats) and the summary. Usage: sh examples/demo.sh [BUILD_DIR]
set -eu

BUILD=${1:-build}
CACHEW=$BUILD/cachew
DATA=$BUILD/demo-data
FILES=8
LINES=50000

if [ ! -x "$CACHEW" ]; then
	echo "demo: $CACHEW is not built (run: make)" >&2
	exit 1
fi

# Writes $FILES text files of $LINES lines each. Deterministic: fixed
# seeds, one per file. A stamp marks a complete set, so an interrupted
# run is redone rather than half-used.
make_corpus() {
	[ -f "$DATA/.complete" ] && return 0
	echo "== generating $FILES x $LINES lines of text under $DATA"
	rm -rf "$DATA"
	mkdir -p "$DATA"
	i=0
	while [ "$i" -lt "$FILES" ]; do
		awk -v seed="$((1000 + i))" -v lines="$LINES" 'BEGIN {
			n = split("data input pipeline tensor batch shuffle " \
			    "prefetch worker cache epoch model gradient loss " \
			    "train sample record image token vector layer " \
			    "kernel thread buffer split lease", w, " ")
			srand(seed)
			for (l = 0; l < lines; l++) {
				k = 3 + int(rand() * 10)
				s = w[1 + int(rand() * n)]
				for (j = 1; j < k; j++)
					s = s " " w[1 + int(rand() * n)]
				print s
			}
		}' > "$DATA/part-$i.tmp"
		mv "$DATA/part-$i.tmp" "$DATA/part-$i.txt"
		i=$((i + 1))
	done
	: > "$DATA/.complete"
}

# TFRecord shards of JPEG Examples, made once (the generator writes each
# shard atomically; the stamp marks a complete set).
IMAGES=512
make_images() {
	[ -f "$DATA/imagenet/.complete" ] && return 0
	echo "== generating $IMAGES ImageNet-like JPEGs in 4 TFRecord shards under $DATA/imagenet"
	rm -rf "$DATA/imagenet"
	"$CACHEW" gen imagenet --out "$DATA/imagenet" --images "$IMAGES" \
	    --shards 4 --seed 1
	: > "$DATA/imagenet/.complete"
}

image_pipeline() {
	echo "list_files(\"$DATA/imagenet/*.tfrecord\", shuffle=false)" \
	    "| interleave(tfrecord, cycle=4)" \
	    "| parse_example(image=\"image/encoded:bytes\", label=\"image/class/label:i64\")" \
	    "| random_resized_crop(size=224, parallel=auto)" \
	    "| flip_left_right" \
	    "| normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])" \
	    "| batch(64) | prefetch(auto)"
}

# Runs one pipeline: its graph (explain), then the run itself.
demo_run() {
	title=$1
	pipeline=$2
	echo
	echo "== $title"
	echo "   $pipeline"
	echo
	"$CACHEW" explain "$pipeline" | sed 's/^/   /'
	echo
	"$CACHEW" run --stats "$pipeline"
}

has_op() {
	"$CACHEW" ops | grep -q "^$1 - "
}

text_pipeline() {
	if has_op interleave && has_op list_files; then
		echo "list_files(\"$DATA/*.txt\", shuffle=false)" \
		    "| interleave(text_lines, cycle=4, parallel=auto)" \
		    "| batch(256) | prefetch(auto)"
	else
		echo "text_lines(\"$DATA/*.txt\") | batch(256) | prefetch(auto)"
	fi
}

echo "cachew demo ($("$CACHEW" version), $(nproc 2>/dev/null || echo '?') CPUs)"
make_corpus
make_images
start=$(date +%s)

demo_run "1/5 ImageNet-like: $IMAGES JPEGs from TFRecord, fused decode + random resized crop 224, flip, normalize, batch 64" \
    "$(image_pipeline)"

demo_run "2/5 numbers: map(add) in parallel, batch, prefetch" \
    "range(10000000) | map(add, value=1, parallel=auto) | batch(64) | prefetch(auto)"

demo_run "3/5 text: $FILES files, $((FILES * LINES)) lines, read in parallel" \
    "$(text_pipeline)"

# Starts `cachewd ARGS...` in the background with its stderr in $2 and
# stores its pid in the variable named $1.
start_daemon() {
	var=$1
	log=$2
	shift 2
	"$BUILD/cachewd" "$@" > /dev/null 2> "$log" &
	eval "$var=$!"
}

# Prints the URL a daemon logged once it listens (10 s at most).
daemon_url() {
	i=0
	while [ $i -lt 200 ]; do
		url=$(sed -n 's/^event=listening.* url=\([^ ]*\).*/\1/p' "$1")
		if [ -n "$url" ]; then
			echo "$url"
			return 0
		fi
		sleep 0.05
		i=$((i + 1))
	done
	echo "demo: cachewd did not start; see $1" >&2
	return 1
}

service_demo() {
	echo
	echo "== 4/5 the C training loop (fake 20 ms model step per batch), in-process (the embedded service, the default), then through the service"
	logs=$DATA/service-logs
	mkdir -p "$logs"
	dpid= w1pid= w2pid=
	trap 'kill $dpid $w1pid $w2pid 2>/dev/null; wait 2>/dev/null' EXIT
	start_daemon dpid "$logs/dispatcher.log" --role=dispatcher \
	    --listen tcp://127.0.0.1:0 --work-dir "$logs/work" \
	    --heartbeat-ms 100
	durl=$(daemon_url "$logs/dispatcher.log")
	# A worker reads only what --allow-read allows (docs/security.md).
	start_daemon w1pid "$logs/worker1.log" --role=worker --dispatcher "$durl" \
	    --listen tcp://127.0.0.1:0 --threads 1 --heartbeat-ms 100 \
	    --allow-read "$DATA"
	start_daemon w2pid "$logs/worker2.log" --role=worker --dispatcher "$durl" \
	    --listen tcp://127.0.0.1:0 --threads 1 --heartbeat-ms 100 \
	    --allow-read "$DATA"
	daemon_url "$logs/worker1.log" > /dev/null
	daemon_url "$logs/worker2.log" > /dev/null
	echo "   dispatcher $durl (pid $dpid), workers pid $w1pid and $w2pid"
	echo
	echo "   \$ $BUILD/train_loop PIPELINE 20"
	"$BUILD/train_loop" "$(image_pipeline)" 20 | sed 's/^/   /'
	echo
	echo "   \$ CACHEW_SERVICE=$durl $BUILD/train_loop PIPELINE 20"
	CACHEW_SERVICE=$durl "$BUILD/train_loop" "$(image_pipeline)" 20 |
	    sed 's/^/   /'
	echo
	"$CACHEW" status "$durl" | sed 's/^/   /'
	kill -TERM "$w1pid" "$w2pid" "$dpid" 2>/dev/null || true
	wait 2>/dev/null || true
	trap - EXIT
}

# One line per decision of the events log: when, the count, the reason.
print_decisions() {
	t0=$(sed -n '1s/^{"ts_ns":\([0-9]*\).*/\1/p' "$1")
	grep -E '"event":"(scale_decision|pool_target)"' "$1" |
	    while IFS= read -r line; do
		ts=$(echo "$line" | sed 's/^{"ts_ns":\([0-9]*\).*/\1/')
		t=$(awk -v a="$ts" -v b="$t0" 'BEGIN { printf "%6.2f", (a - b) / 1e9 }')
		case $line in
		*'"event":"pool_target"'*)
			n=$(echo "$line" | sed 's/.*"workers":\([0-9]*\).*/\1/')
			echo "   $t s  pool target $n workers" ;;
		*)
			n=$(echo "$line" | sed 's/.*"want":\([0-9]*\).*/\1/')
			why=$(echo "$line" | sed 's/.*"reason":"\(.*\)"}$/\1/')
			echo "   $t s  job wants $n: $why" ;;
		esac
	done
}

# While pid runs: each second the decisions that are new in the events log
# $2, and every third second the pool line of `cachew status $3`, so the
# run is never silent for long.
follow_decisions() {
	shown=0 tick=0
	while kill -0 "$1" 2>/dev/null; do
		sleep 1
		tick=$((tick + 1))
		[ -f "$2" ] || continue
		print_decisions "$2" > "$2.shown"
		n=$(wc -l < "$2.shown")
		if [ "$n" -gt "$shown" ]; then
			tail -n "$((n - shown))" "$2.shown"
			shown=$n
		elif [ $((tick % 3)) = 0 ]; then
			echo "   ${tick} s   $("$CACHEW" status "$3" 2>/dev/null | grep '^pool')"
		fi
	done
	rm -f "$2.shown"
	wait "$1"
}

# The cache mode of each job (epoch) and what each pass end decided, with
# the epoch's time from its job_created to its epoch_done.
print_cache_passes() {
	grep -E '"event":"(job_created|epoch_done|autocache)"' "$1" |
	    while IFS= read -r line; do
		ts=$(echo "$line" | sed 's/^{"ts_ns":\([0-9]*\).*/\1/')
		job=$(echo "$line" | sed 's/.*"job_id":\([0-9]*\).*/\1/')
		case $line in
		*'"event":"job_created"'*'"cache_mode"'*)
			created=$ts
			mode=$(echo "$line" | sed 's/.*"cache_mode":"\([a-z]*\)".*/\1/') ;;
		*'"event":"epoch_done"'*)
			[ -n "${created:-}" ] &&
			    awk -v a="$ts" -v b="$created" -v j="$job" -v m="$mode" \
				'BEGIN { printf "   job %d: %-7s %6.2f s\n", j, m, (a - b) / 1e9 }' ;;
		*'"event":"autocache"'*)
			why=$(echo "$line" | sed 's/.*"cache":"\(.*\)"}$/\1/')
			echo "            -> $why" ;;
		esac
	done
}

autoscale_demo() {
	echo
	echo "== 5/5 autoscaling and autocaching: the dispatcher starts its workers (process provisioner, at most 4)"
	logs=$DATA/autoscale-logs
	rm -rf "$logs"
	mkdir -p "$logs"
	dpid=
	trap 'kill $dpid 2>/dev/null; wait 2>/dev/null' EXIT
	start_daemon dpid "$logs/dispatcher.log" --role=dispatcher \
	    --listen tcp://127.0.0.1:0 --work-dir "$logs/work" \
	    --heartbeat-ms 200 --provisioner process --max-workers 4 \
	    --worker-threads 1 --scale-policy model --cache-root "$logs/cache"
	durl=$(daemon_url "$logs/dispatcher.log")
	pipeline="range(12000) | map(sleep_us, us=2000)"
	echo "   dispatcher $durl (pid $dpid), no worker yet"
	echo "   one worker (--threads 1): at most 500 elements/s; the consumer sleeps 0.5 ms per element"
	echo
	echo "   \$ CACHEW_SERVICE=$durl $BUILD/train_loop \"$pipeline\" 0.5"
	echo "   decisions as they come (events log $logs/work/events.jsonl), the pool every 3 s:"
	CACHEW_SERVICE=$durl "$BUILD/train_loop" "$pipeline" 0.5 \
	    > "$logs/train_loop.out" &
	follow_decisions $! "$logs/work/events.jsonl" "$durl"
	echo
	sed 's/^/   /' "$logs/train_loop.out"
	echo
	"$CACHEW" status "$durl" | grep -E '^pool|policy' | sed 's/^/   /'
	echo
	cpipe="range(3000) | map(sleep_us, us=1000) | map(add, value=1)"
	echo "   autocaching (--cache-root): 4 epochs of an expensive pipeline; each epoch is a job"
	echo "   (job 1, the training loop above, was profiled too)"
	echo "   \$ CACHEW_SERVICE=$durl $CACHEW run --epochs 4 \"$cpipe\""
	CACHEW_SERVICE=$durl "$CACHEW" run --epochs 4 "$cpipe" 2>&1 |
	    grep -E 'elements' | sed 's/^/   /'
	print_cache_passes "$logs/work/events.jsonl"
	kill -TERM "$dpid" 2>/dev/null || true
	wait 2>/dev/null || true
	trap - EXIT
	plot_jobs "$logs/work/events.jsonl" "$DATA/plots"
}

# Each job of the events log as a PNG (workers, throughput, client wait,
# cache mode over time), naming the files; without gnuplot, says so.
plot_jobs() {
	echo
	if ! command -v gnuplot >/dev/null 2>&1 && [ -z "${CACHEW_GNUPLOT:-}" ]; then
		echo "   (no plots: gnuplot is not installed; sh .ci/test-deps.sh installs gnuplot-nox)"
		return 0
	fi
	echo "   \$ $CACHEW plot $1 --out $2"
	rm -rf "$2"
	"$CACHEW" plot "$1" --out "$2" | sed 's/^/   /' ||
	    echo "   (cachew plot failed)"
}

if [ -x "$BUILD/cachewd" ] && [ -x "$BUILD/train_loop" ]; then
	service_demo
	autoscale_demo
fi

echo
echo "== done in $(($(date +%s) - start)) s. Next: build/cachew help," \
    "examples/train_loop.c, docs/cli.md"

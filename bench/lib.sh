# bench/lib.sh: what bench/run and bench/ab share — the processes they start (children of the
# script, in its session, stopped on exit), ports, config templates, the upstream and Redis, and
# the counters they read. Sourced; expects HERE (bench/) and, for start_upstream, UP_WORKERS,
# NOFILE and CONNS_MAX.

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# processes: everything started is recorded and stopped on exit

PIDS=()
WORK=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [[ -n $WORK && -d $WORK ]]; then
        if [[ ${BENCH_KEEP:-0} == 1 ]]; then
            log "work directory kept: $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD...: runs CMD in the background, output to $WORK/NAME.log; sets STARTED_PID
start() {
    local name=$1
    shift
    "$@" >"$WORK/$name.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
}

# stop PID: TERM, up to 5 s, then KILL
stop() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    local kept=()
    for i in "${PIDS[@]}"; do [[ $i == "$pid" ]] || kept+=("$i"); done
    PIDS=("${kept[@]}")
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_port PORT PID NAME: until PORT accepts connections (10 s), or PID died
wait_port() {
    local port=$1 pid=$2 name=$3 i
    for i in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -20 "$WORK/$name.log" >&2 || true
            die "$name exited before listening on $port"
        fi
        sleep 0.05
    done
    tail -20 "$WORK/$name.log" >&2 || true
    die "$name is not listening on $port after 10 s"
}

# render TEMPLATE OUT KEY=VALUE...: the template with every @KEY@ replaced
render() {
    local template=$1 out=$2
    shift 2
    local args=() kv
    for kv in "$@"; do args+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
    sed "${args[@]}" "$template" >"$out"
    if grep -q '@[A-Z_]*@' "$out"; then die "unfilled placeholder in $out"; fi
}

# check_ok URL NAME: one request must answer 200 "ok" (the upstream's body), else the run is void
check_ok() {
    local url=$1 name=$2 code body
    body=$(curl -s -m 5 -o - -w '\n%{http_code}' "$url" || true)
    code=${body##*$'\n'}
    body=${body%$'\n'*}
    if [[ $code != 200 || $body != ok ]]; then
        log "warning: $name answered $code '${body:0:80}' instead of 200 'ok'"
        return 1
    fi
}

redis_calls() {
    redis-cli -p "$REDIS_PORT" info commandstats |
        awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ { s += $3 } END { print s + 0 }'
}

# cpu_split PID: "USER SYSTEM", the clock ticks of PID and of its children (nginx's workers);
# the fields after the command name, which may hold spaces: utime and stime are 12 and 13
cpu_split() {
    local user=0 system=0 p u s
    for p in "$1" $(pgrep -P "$1" 2>/dev/null); do
        read -r u s < <(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12, $13 }') || continue
        user=$((user + ${u:-0}))
        system=$((system + ${s:-0}))
    done
    echo "$user $system"
}

# cpu_ticks PID: user and system clock ticks of PID and of its children (nginx's workers)
cpu_ticks() {
    local user system
    read -r user system < <(cpu_split "$1")
    echo $((user + system))
}

start_upstream() {
    local dir=$WORK/upstream
    mkdir -p "$dir"
    UP_PORT=$(free_port)
    render "$HERE/conf/upstream-nginx.conf" "$dir/nginx.conf" DIR="$dir" UP_PORT="$UP_PORT" \
        UP_WORKERS="$UP_WORKERS" NOFILE="$NOFILE" CONNS_MAX="$CONNS_MAX"
    start upstream nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log"
    UP_PID=$STARTED_PID
    wait_port "$UP_PORT" "$UP_PID" upstream
    check_ok "http://127.0.0.1:$UP_PORT/" upstream || die "the upstream does not answer 200 ok"
}

start_redis() {
    mkdir -p "$WORK/redis"
    REDIS_PORT=$(free_port)
    start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$WORK/redis" --protected-mode no --maxclients 10000
    REDIS_PID=$STARTED_PID
    wait_port "$REDIS_PORT" "$REDIS_PID" redis
}

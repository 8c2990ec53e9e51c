# Shared by deploy/prometheus/{up,down} and deploy/alertmanager/{up,down}: start a loopback server in the background
# with its pid and log in a run folder, wait until a readiness URL answers, stop it by its pid. Sourced, not run.
#
# svc_up NAME RUN_DIR READY_URL TIMEOUT_S -- COMMAND...   exit 0 when ready (or already running), 1 with the reason
# svc_down NAME RUN_DIR                                    exit 0 when stopped (or not running)

svc_die() { echo "$SVC_SCRIPT: $*" >&2; exit 1; }

svc_up() {
  local name="$1" run="$2" ready="$3" timeout="$4"; shift 5
  local pidfile="$run/$name.pid" log="$run/$name.log" pid
  mkdir -p "$run"
  if [[ -f "$pidfile" ]] && pid="$(cat "$pidfile")" && [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    if curl -fsS -o /dev/null --max-time 2 "$ready"; then
      echo "$name already running (pid $pid): ${ready%/-/ready}"
      return 0
    fi
    svc_die "$name (pid $pid) is running but not ready at $ready; see $log or run the down script"
  fi
  command -v "$1" >/dev/null || svc_die "$1 not found (Debian: apt-get install prometheus prometheus-alertmanager)"
  setsid "$@" >>"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  local deadline=$(( $(date +%s) + timeout ))
  until curl -fsS -o /dev/null --max-time 2 "$ready" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pidfile"; tail -n 20 "$log" >&2
      svc_die "$name exited during startup (log: $log)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 20 "$log" >&2
      svc_die "$name (pid $pid) not ready at $ready after ${timeout}s (log: $log)"
    fi
    sleep 0.2
  done
  echo "$name running (pid $pid): ${ready%/-/ready}   log: $log"
}

svc_down() {
  local name="$1" run="$2" pidfile="$2/$1.pid" pid i
  if [[ ! -f "$pidfile" ]]; then echo "$name not running"; return 0; fi
  pid="$(cat "$pidfile")"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    echo "$name stopped (pid $pid)"
  else
    echo "$name not running (stale pid file removed)"
  fi
  rm -f "$pidfile"
}

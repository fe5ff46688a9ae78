# shellcheck shell=bash disable=SC2034  # SL_WHY is read by the tests that source this file
# A throw-away single-node Slurm on this host for the tests: munged, slurmctld and slurmd run as
# root from a temporary directory (config, munge key and socket, state, spool, logs, pid files)
# on free ports, and every process they start can be found again and ended.
#   slurm_start DIR   start the cluster under DIR (made here; munged wants every directory
#                     above it searchable by all); on failure returns 1 with the reason in SL_WHY
#   sl CMD...         run a Slurm client (sbatch, squeue, scontrol, ...) against it
#   slurm_stop        cancel every job and end every process the cluster started; safe to call
#                     twice or after a failed start
# Processes are told apart by their environment: the daemons, what they start, and the jobs
# submitted with `sl sbatch` (which pass the submitting environment on) carry
# SLURM_CONF=DIR/slurm.conf, which nothing else on the machine has.
SL_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SL_DIR=""
SL_WHY=""
SL_CTLD_T0_MS=0

sl() { SLURM_CONF=$SL_DIR/slurm.conf "$@"; }

# Two TCP ports nobody listens on now.
_slurm_free_ports() {
  /usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])'
}

# _slurm_wait SECONDS CMD...: true once CMD succeeds, polling every 0.2 s.
_slurm_wait() {
  local until=$((SECONDS + $1))
  shift
  while ! "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || return 1
    sleep 0.2
  done
}

_slurm_node_idle() { [ "$(sl sinfo -h -N -o %t 2>/dev/null)" = idle ]; }

slurm_start() {
  SL_DIR=$1
  # Run inside a job of another Slurm (make test on a cluster), its variables would leak into
  # this cluster's jobs.
  unset "${!SLURM_@}" "${!SBATCH_@}" "${!SRUN_@}" "${!SALLOC_@}"
  local node ports ctld_port slurmd_port
  node=$(hostname -s)
  for b in munged munge slurmctld slurmd sbatch; do
    command -v "$b" >/dev/null || { SL_WHY="no $b binary (Debian packages munge, slurmctld, slurmd, slurm-client)"; return 1; }
  done
  [ "$(id -u)" = 0 ] || { SL_WHY="the test cluster's daemons run as root; this is uid $(id -u)"; return 1; }
  # munged wants its socket's directory searchable by all and its key private.
  mkdir -p "$SL_DIR"/{munge,state,spool,log} && chmod 755 "$SL_DIR" "$SL_DIR/munge" || return 1
  dd if=/dev/urandom of="$SL_DIR/munge/munge.key" bs=1024 count=1 2>/dev/null
  chmod 400 "$SL_DIR/munge/munge.key"
  ports=$(_slurm_free_ports) || { SL_WHY="could not find free ports"; return 1; }
  read -r ctld_port slurmd_port <<<"$ports"
  sed -e "s|@DIR@|$SL_DIR|g" -e "s|@NODE@|$node|g" -e "s|@CTLD_PORT@|$ctld_port|g" \
      -e "s|@SLURMD_PORT@|$slurmd_port|g" \
      "$SL_HERE/slurm.conf.in" >"$SL_DIR/slurm.conf"

  local m=$SL_DIR/munge
  if ! sl munged --socket="$m/munge.sock" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
         --log-file="$m/munged.log" --seed-file="$m/munged.seed" >"$m/start.txt" 2>&1 ||
     ! _slurm_wait 10 munge -S "$m/munge.sock" -n; then
    SL_WHY="munged did not start: $(tail -1 "$m/munged.log" 2>/dev/null || cat "$m/start.txt")"
    return 1
  fi
  # Its time-limit checks run every 30 s from here (test_slurm.sh times a job to them).
  SL_CTLD_T0_MS=$(( $(date +%s%N) / 1000000 ))
  if ! sl slurmctld -f "$SL_DIR/slurm.conf" >"$SL_DIR/log/slurmctld.start" 2>&1 ||
     ! _slurm_wait 20 sl scontrol ping; then
    SL_WHY="slurmctld did not start: $(grep -m1 -iE 'fatal|error' "$SL_DIR/log/slurmctld.log" "$SL_DIR/log/slurmctld.start" 2>/dev/null)"
    return 1
  fi
  if ! sl slurmd -f "$SL_DIR/slurm.conf" -N "$node" >"$SL_DIR/log/slurmd.start" 2>&1 ||
     ! _slurm_wait 30 _slurm_node_idle; then
    SL_WHY="slurmd did not register node $node as idle: $(grep -m1 -iE 'fatal' "$SL_DIR/log/slurmd.log" "$SL_DIR/log/slurmd.start" 2>/dev/null)"
    return 1
  fi
}

# PIDs of live processes whose environment carries this cluster's SLURM_CONF (not this shell).
_slurm_pids() {
  local marker="SLURM_CONF=$SL_DIR/slurm.conf" p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    if [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ]; then continue; fi
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "$marker" && echo "$p"
  done
}

_slurm_none_left() { [ -z "$(_slurm_pids)" ]; }
_slurm_no_jobs() { [ -z "$(sl timeout 5 squeue -h -t R,CG -o %i 2>/dev/null)" ]; }

_slurm_kill_pidfile() {
  local f=$1 pid
  [ -f "$f" ] && pid=$(cat "$f") && [ -n "$pid" ] && kill "$pid" 2>/dev/null
}

slurm_stop() {
  [ -n "$SL_DIR" ] && [ -d "$SL_DIR" ] || return 0
  if [ -f "$SL_DIR/slurmctld.pid" ]; then
    sl timeout 10 scancel --full --user=root >/dev/null 2>&1
    _slurm_wait 20 _slurm_no_jobs
  fi
  _slurm_kill_pidfile "$SL_DIR/slurmd.pid"
  _slurm_kill_pidfile "$SL_DIR/slurmctld.pid"
  _slurm_kill_pidfile "$SL_DIR/munge/munged.pid"
  _slurm_wait 10 _slurm_none_left
  local left
  left=$(_slurm_pids)
  if [ -n "$left" ]; then
    echo "slurm_stop: killing leftover processes: $(echo "$left" | tr '\n' ' ')" >&2
    # shellcheck disable=SC2086
    kill -9 $left 2>/dev/null
    _slurm_wait 5 _slurm_none_left
  fi
  SL_DIR=""
}

#!/bin/bash
# Start a real slurmctld on SLURM_CONF (the role test's slurm.conf, which includes the rendered
# fragment) for a few seconds, print what it made of the nodes and partitions, then stop it.
# Run it under the project's test-cluster lock:
#   flock --close /tmp/slurm-spot-test-cluster.lock check-slurmctld.sh SLURM_CONF
# (--close: the munged this may start must not inherit the lock and hold it for ever).
# Exit 0 when slurmctld came up and answered; its log is printed when it did not.
set -euo pipefail
conf=${1:?usage: check-slurmctld.sh SLURM_CONF}
export SLURM_CONF=$conf
value() { sed -n "s/^$1=//p" "$conf" | tail -n 1; }
pid_file=$(value SlurmctldPidFile)
state_dir=$(value StateSaveLocation)
log_file=$(value SlurmctldLogFile)

# munge: start it if it does not answer (and leave it running, as the other tests do).
if ! munge -n </dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# A fresh state: this cluster only lives for the check.
find "$state_dir" -mindepth 1 -delete
: >"$log_file"
rm -f "$pid_file"

timeout 120 slurmctld -D -f "$conf" </dev/null >>"$log_file" 2>&1 &
launcher=$!
stop() {
  local pid
  pid=$(cat "$pid_file" 2>/dev/null || true)
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  kill "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
}
trap stop EXIT

up=""
for _ in $(seq 100); do
  if scontrol ping 2>/dev/null | grep -q "is UP"; then up=yes; break; fi
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.2
done
if [ -z "$up" ]; then
  echo "slurmctld did not come up on $conf; its log:" >&2
  cat "$log_file" >&2
  exit 1
fi
echo "=== scontrol -o show node"
scontrol -o show node
echo "=== sinfo"
sinfo -h -o "%R %D %T"
echo "=== scontrol show config (power saving and hooks)"
scontrol show config | grep -E "^(ResumeProgram|SuspendProgram|ResumeFailProgram|Prolog|TaskProlog|Epilog|RequeueExit|SuspendTime) "

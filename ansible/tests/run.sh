#!/bin/bash
# The Ansible role test (issue 7), run by tests/test_ansible.py and so by `make test`:
#   1. tests/check.yml with --check on a fresh scratch prefix: no failure, nothing written;
#   2. tests/test.yml twice on that prefix: the second run must report changed=0;
#   3. ansible-lint with the production profile on ansible/.
# Needs root, Slurm (slurmctld, scontrol) and munge, ansible-playbook and ansible-lint on PATH.
# SLURM_SPOT_ANSIBLE_PREFIX: the scratch prefix (default /tmp/slurm-spot-ansible-test).
set -euo pipefail
cd "$(dirname "$0")/.."
export SLURM_SPOT_ANSIBLE_PREFIX=${SLURM_SPOT_ANSIBLE_PREFIX:-/tmp/slurm-spot-ansible-test}
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
case "$SLURM_SPOT_ANSIBLE_PREFIX" in
  /tmp/?*|/var/tmp/?*) ;;
  *) echo "run.sh: SLURM_SPOT_ANSIBLE_PREFIX must be a scratch directory under /tmp or /var/tmp" >&2; exit 2 ;;
esac
for tool in ansible-playbook ansible-lint; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found: pip install -e '.[dev]'" >&2; exit 2; }
done

rm -rf "$SLURM_SPOT_ANSIBLE_PREFIX"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Check mode on a fresh host (the README says --check works): no failure, changes announced,
# and nothing of slurm-spot written (no virtualenv, no spot.yaml).
echo "=== ansible-playbook --check tests/check.yml: fresh host"
ansible-playbook --check -i tests/inventory.ini tests/check.yml 2>&1
for written in opt/slurm-spot etc/slurm/spot.yaml etc/slurm/slurm-spot.conf etc/systemd; do
  if [ -e "$SLURM_SPOT_ANSIBLE_PREFIX/$written" ]; then
    echo "run.sh: FAIL: check mode wrote $SLURM_SPOT_ANSIBLE_PREFIX/$written" >&2
    exit 1
  fi
done
echo "=== check mode wrote nothing"
for run in 1 2; do
  echo "=== ansible-playbook tests/test.yml: run $run"
  start=$SECONDS
  # The second run writes the same files (its recap must say so): no second slurmctld.
  slurmctld_check=$([ "$run" = 1 ] && echo true || echo false)
  ansible-playbook -i tests/inventory.ini tests/test.yml -e "slurm_spot_test_slurmctld=$slurmctld_check" 2>&1 | tee "$log"
  echo "=== run $run took $((SECONDS - start)) s"
done
changed=$(sed -n '/^PLAY RECAP/,$ s/.* changed=\([0-9]*\) .*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
if [ "$changed" != 0 ]; then
  echo "run.sh: FAIL: the second run changed $changed thing(s); the role is not idempotent" >&2
  exit 1
fi
echo "=== second run: changed=0"

echo "=== ansible-lint --profile production"
start=$SECONDS
ansible-lint --profile production
echo "=== ansible-lint took $((SECONDS - start)) s"

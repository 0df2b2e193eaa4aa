#!/usr/bin/env bash
# System packages the test suite uses, from Debian's repositories, installed when missing:
#   promtool (package prometheus)  lints the collector's /metrics
#   prometheus-alertmanager        the Alertmanager alert sink's tests run against a real one
#   openssl                        makes the TLS test's throwaway certificate
#   influxd (package influxdb)     the InfluxDB store's tests run against a real server
#   slurmctld, slurmd (slurm-wlm)  the Slurm repair backend's tests drive a real Slurm
#   munged (package munge)         Slurm's authentication
#   chromium                       the dashboard's real-browser test
#   systemd-analyze (systemd)      verifies deploy/systemd's units
#   initdb, postgres (postgresql)  the control plane's PostgreSQL tests start a real server
#   cc (package gcc)               builds tests/harness/skewed_clock.c: PostgreSQL with its clock hours off the replicas'
#                                  and the C stand-in NVML (collector/simnvml/clibrary.py) the collector tests load
#   ssh (openssh-client)           the hook the adversarial tests run (a crafted node name once made ssh run a command)
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v influxd >/dev/null 2>&1 || missing+=(influxdb)
command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
# Two system users the workloads tests submit real Slurm jobs as (sbatch --uid, as root): the
# jobs of two users in two accounts (tests/fleet/test_workloads_slurm.py).
for user in gpufleet-alice gpufleet-bob; do
  id "$user" >/dev/null 2>&1 && continue
  if [ "$(id -u)" -eq 0 ]; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  elif command -v sudo >/dev/null 2>&1; then
    sudo useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  else
    echo "install-test-deps: need the system user $user (as root: useradd --system $user)" >&2
    exit 1
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  echo "install-test-deps: need ${missing[*]} (Debian packages); run as root or install them" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "install-test-deps: installing ${missing[*]} with apt-get"
log=$(mktemp)
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "install-test-deps: apt-get failed; the full log is $log" >&2
  exit 1
fi
rm -f "$log"

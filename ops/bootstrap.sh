#!/usr/bin/env bash
# Install everything notiflow needs on a fresh clone: system packages (Java 17, Maven,
# redis-server, and promtool from Debian's prometheus package) when missing, the Python venv
# with pinned dependencies, the Kafka and Cassandra jars from Maven Central and SeaweedFS's
# weed, helm and kubeconform built with Go from the Go module proxy (cached in
# ~/.cache/notiflow). Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*"; }

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ((${#missing[@]})); then
  say "installing system packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: please install ${missing[*]} (no apt-get here)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
    "${sudo_cmd[@]}" apt-get update -q >/dev/null
    "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}" >/dev/null
  }
fi

# promtool checks and unit-tests ops/prometheus/alerts.yml (tests/unit/test_alert_rules.py).
# Debian ships it only inside the prometheus package; without recommends, so no node exporter.
# On a host that starts packaged services (systemd) it also starts a Prometheus server on
# :9090: `systemctl disable --now prometheus` stops it; notiflow needs only promtool.
if ! command -v promtool >/dev/null 2>&1; then
  say "installing promtool (Debian package prometheus)"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: please install promtool (Prometheus) (no apt-get here)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
    "${sudo_cmd[@]}" apt-get update -q >/dev/null
    "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends prometheus >/dev/null
  }
fi

PY=""
for cand in python3.11 python3.12 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
    PY=$cand
    break
  fi
done
[ -n "$PY" ] || { echo "error: Python 3.11 or 3.12 is required" >&2; exit 1; }

stamp=.venv/.notiflow-deps
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "creating .venv and installing pinned Python dependencies"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip==25.3
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,bench,analytics]"
  echo "$want" > "$stamp"
fi

# Go's official tarball installs into /usr/local/go; its bin is not always on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
say "fetching Kafka and Cassandra jars, building SeaweedFS and toxiproxy (cached)"
.venv/bin/notiflow stack fetch
# helm, kubeconform and the Kubernetes/KEDA schemas that check the Helm chart offline
# (tests/unit/test_helm_chart.py)
say "building helm and kubeconform, writing the chart's schemas (cached)"
.venv/bin/notiflow stack kube-tools

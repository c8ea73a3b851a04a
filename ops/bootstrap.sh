#!/usr/bin/env bash
# Install what notiflow needs on a fresh clone, by profile (safe to run repeatedly):
#
#   ops/bootstrap.sh          everything (`make test`, `make stack-up`): system packages
#                             (Java 17, Maven, redis-server, promtool from Debian's
#                             prometheus package, chromium and chromium-driver) when missing, the Python venv with pinned
#                             dependencies and the dev, bench, analytics, emulators, archive and
#                             ses extras, the Kafka and Cassandra jars from Maven Central,
#                             SeaweedFS's weed, toxiproxy, helm and kubeconform built with Go
#                             from the Go module proxy, and the chart's schemas (cached in
#                             ~/.cache/notiflow, or NOTIFLOW_CACHE_DIR)
#   ops/bootstrap.sh --demo   only what `notiflow demo` runs (`make demo`): Java 17, Maven,
#                             redis-server and the venv with the emulators extra (the demo runs
#                             `notiflow fakes`); the demo's stack fetches the jars itself and
#                             leaves the object store out, so no Go build
#   ops/bootstrap.sh --plan   print the steps of the profile (with --demo: the demo's) and stop
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: ops/bootstrap.sh [--demo] [--plan]"
}

profile=full
plan=0
for arg in "$@"; do
  case "$arg" in
    --demo) profile=demo ;;
    --plan) plan=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown option $arg" >&2; usage >&2; exit 2 ;;
  esac
done

# the steps of each profile, in order; `--plan` prints them
case "$profile" in
  full) steps=(system-packages promtool browser venv-full stack-fetch kube-tools) ;;
  demo) steps=(system-packages venv) ;;
esac
if [ "$plan" = 1 ]; then
  printf '%s\n' "${steps[@]}"
  exit 0
fi
step() { [[ " ${steps[*]} " == *" $1 "* ]]; }

say() { printf '==> %s\n' "$*"; }

# apt_install WHAT PACKAGE... : install Debian packages (as root, or through sudo), refreshing
# the package lists once if the first attempt fails; WHAT names them in the error without apt.
apt_install() {
  local what=$1 sudo_cmd=()
  shift
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: please install $what (no apt-get here)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get install -y -q "$@" >/dev/null 2>&1 || {
    "${sudo_cmd[@]}" apt-get update -q >/dev/null
    "${sudo_cmd[@]}" apt-get install -y -q "$@" >/dev/null
  }
}

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ((${#missing[@]})); then
  say "installing system packages: ${missing[*]}"
  apt_install "${missing[*]}" "${missing[@]}"
fi

# promtool checks and unit-tests ops/prometheus/alerts.yml (tests/unit/test_alert_rules.py).
# Debian ships it only inside the prometheus package; without recommends, so no node exporter.
# On a host that starts packaged services (systemd) it also starts a Prometheus server on
# :9090: `systemctl disable --now prometheus` stops it; notiflow needs only promtool.
if step promtool && ! command -v promtool >/dev/null 2>&1; then
  say "installing promtool (Debian package prometheus)"
  apt_install "promtool (Prometheus)" --no-install-recommends prometheus
fi

# The hosted pages are tested in a real browser: Debian's Chromium and its WebDriver, driven
# by Selenium (tests/integration/test_preference_page_browser.py).
if step browser && ! command -v chromedriver >/dev/null 2>&1; then
  say "installing chromium and chromium-driver (browser tests)"
  apt_install "chromium and chromium-driver" --no-install-recommends chromium chromium-driver
fi

PY=""
for cand in python3.11 python3.12 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
    PY=$cand
    break
  fi
done
[ -n "$PY" ] || { echo "error: Python 3.11 or 3.12 is required" >&2; exit 1; }

# The stamp holds the hash of the pins, plus " demo" when only the demo's dependencies (the
# emulators extra) are installed: the full profile then installs the other extras, the demo's
# takes either.
stamp=.venv/.notiflow-deps
UV_VERSION=0.13.8
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if step venv-full; then
  spec=".[dev,bench,analytics,emulators,archive,ses]" made=$want
  what="with the dev, bench, analytics, emulators, archive and ses extras"
else
  spec=".[emulators]" made="$want demo" what="the demo's: the emulators extra"
fi
if [ ! -x .venv/bin/python ] || { [ "$have" != "$want" ] && [ "$have" != "$made" ]; }; then
  say "creating .venv and installing pinned Python dependencies ($what)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  # uv installs the same pins as pip in a fraction of the time (docs/architecture.md,
  # "Dependencies")
  .venv/bin/python -m pip install -q --disable-pip-version-check pip==25.3 "uv==$UV_VERSION"
  .venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt -e "$spec"
  echo "$made" > "$stamp"
fi

# Go's official tarball installs into /usr/local/go; its bin is not always on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
if step stack-fetch; then
  say "fetching Kafka and Cassandra jars, building SeaweedFS and toxiproxy (cached)"
  .venv/bin/notiflow stack fetch
fi
if step kube-tools; then
  # helm, kubeconform and the Kubernetes/KEDA schemas that check the Helm chart offline
  # (tests/unit/test_helm_chart.py)
  say "building helm and kubeconform, writing the chart's schemas (cached)"
  .venv/bin/notiflow stack kube-tools
fi

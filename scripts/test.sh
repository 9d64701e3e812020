#!/usr/bin/env bash
# The one command that passes every test (README.md, .ci/run). It installs what is missing from
# Debian's packages, runs the whole workspace's tests against real servers the harness starts on
# loopback, and fails if any server process outlives the run.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v etcd >/dev/null || need+=(etcd-server)
# The interop tests drive etcd's own lock recipe through etcdctl.
command -v etcdctl >/dev/null || need+=(etcd-client)
# ... and kazoo's lock (Debian's Python, whatever `python3` is first on the PATH).
/usr/bin/python3 -c 'import kazoo' 2>/dev/null || need+=(python3-kazoo)
# ... and redis-py's.
/usr/bin/python3 -c 'import redis' 2>/dev/null || need+=(python3-redis)
# ... and Curator's, run by a JDK's single-file source launcher.
[ -f /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
java --list-modules 2>/dev/null | grep -q '^jdk.compiler' || need+=(default-jdk-headless)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v java >/dev/null || need+=(default-jre-headless)
command -v protoc >/dev/null || need+=(protobuf-compiler)
# The PostgreSQL backend's server (the harness runs it as user postgres, which the package makes).
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql)
# ... and a pooler in front of it (the backend refuses transaction pooling, works in session mode).
[ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v openssl >/dev/null || need+=(openssl)
# `script` gives the command's tests a terminal.
command -v script >/dev/null || need+=(bsdutils)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

servers='/usr/bin/redis-server|/usr/bin/etcd|zookeeper\.jar|/usr/lib/postgresql/15/bin/postgres|/usr/sbin/pgbouncer'
before=$(pgrep -f "$servers" | sort || true)

# Each step says when it began, so the run's budget can be read from its log.
step() { echo "== $* (at ${SECONDS}s)"; }

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The facade alone, as README's first command builds it (memory backend only).
cargo clippy -p distlock --all-targets --quiet -- -D warnings

step "README's first command on a machine without protoc (its own target dir, PROTOC failing)"
first=(env PROTOC=/bin/false CARGO_TARGET_DIR=target/first-command cargo run -q -p distlock --example oversell --)
"${first[@]}" --short | tail -n 4
# A scheme whose backend that build left out is refused, naming the feature to enable.
if out=$("${first[@]}" --backend etcd://127.0.0.1:1 2>&1); then
  echo "the memory-only build accepted an etcd URL"; exit 1
fi
grep -q 'cargo feature "etcd"' <<<"$out" || { echo "no feature named in: $out"; exit 1; }

step "docs and packages"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo package --workspace --no-verify --allow-dirty --quiet \
  --exclude distlock-conformance --exclude distlock-bench --exclude distlock-chaos

step "the distlock command installs (the debug build this run makes anyway)"
CARGO_TARGET_DIR=target cargo install --quiet --locked --path cli --debug --root target/cli-install --force
target/cli-install/bin/distlock --version

step "tests"
# Two threads: the server suites share the machine's 2 cores with the servers they start. The
# scenario suite (conformance-tests/tests/conformance.rs) runs three: its scenarios mostly wait
# out TTLs and pauses (a 2-thread run keeps the cores a fifth busy), and it is most of the time.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
suites=()
for f in conformance-tests/tests/*.rs; do
  n=$(basename "$f" .rs)
  [ "$n" = conformance ] || suites+=(--test "$n")
done
{
  cargo test --workspace --exclude distlock-conformance -- --test-threads=2
  cargo test -p distlock-conformance --lib --bins "${suites[@]}" -- --test-threads=2
  cargo test -p distlock-conformance --test conformance -- --test-threads=3
} 2>&1 | tee "$log"
read -r passed failed < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$log")

step "fault campaign, short (every deployment, every primitive on each backend family; the full one writes docs/faults.md)"
# Two runs at once: a run mostly waits out its fault and its servers' start and stop, so two
# leave the cores about a third busy and take half the time.
cargo run -q -p distlock-chaos -- campaign --short --jobs 2 --out target/faults-short.md

step "benchmark smoke run (a few hundred iterations; the report is docs/bench.md)"
cargo run -q -p distlock-bench -- --smoke --out target/bench-smoke | tail -n 3

after=$(pgrep -f "$servers" | sort || true)
leaked=$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d')
if [ -n "$leaked" ]; then
  echo "server processes outlived the tests:"; ps -o pid,args -p $(echo $leaked | tr ' ' ',')
  exit 1
fi
echo "== no server process left running (${SECONDS}s in all)"
echo "tests: $passed passed, $failed failed"

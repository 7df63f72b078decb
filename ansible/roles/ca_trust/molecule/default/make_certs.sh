#!/usr/bin/env bash
# Test PKI for the scenario, in DIR: test-ca and second-ca (both installed by the role), rogue-ca (never
# installed), dropped-ca (trusted before the role as a file the role once installed, so the role removes it)
# and other-ca (trusted before the role by another tool's file, which stays), and a server certificate for
# HOST from test-ca (good), rogue-ca (rogue), dropped-ca (dropped) and other-ca (other).
set -euo pipefail
dir=$1 host=$2
mkdir -p "$dir"
cd "$dir"
for ca in test-ca second-ca rogue-ca dropped-ca other-ca; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=ddp $ca" \
    -keyout "$ca.key" -out "$ca.crt" 2>/dev/null
done
for kind in good:test-ca rogue:rogue-ca dropped:dropped-ca other:other-ca; do
  name=${kind%%:*} ca=${kind#*:}
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
    -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 2 \
    -extfile <(printf 'subjectAltName=DNS:%s\n' "$host") -out "$name.crt" 2>/dev/null
done

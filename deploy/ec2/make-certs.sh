#!/usr/bin/env bash
# Make the secrets of a codedgd deployment: a private CA, the coordinator's TLS certificate
# (signed by that CA) and a random shared token.
#
#   deploy/ec2/make-certs.sh OUT_DIR [SERVER_NAME] [SERVER_IP...]
#
# SERVER_NAME (default coordinator.codedgd.internal) is the name workers verify
# (CODEDGD_TLS_SERVER_NAME); it does not have to resolve in DNS. Any SERVER_IP is added to
# the certificate too. OUT_DIR gets ca.pem, ca.key (keep it offline), coordinator.pem,
# coordinator.key and token. Needs openssl.
set -euo pipefail
out="${1:?usage: make-certs.sh OUT_DIR [SERVER_NAME] [SERVER_IP...]}"
name="${2:-coordinator.codedgd.internal}"
shift $(( $# >= 2 ? 2 : 1 ))
san="DNS:${name}"
for ip in "$@"; do san="${san},IP:${ip}"; done

mkdir -p "$out"
cd "$out"
umask 077
openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=codedgd CA" \
    -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=${name}" \
    -keyout coordinator.key -out coordinator.csr 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > coordinator.ext
openssl x509 -req -in coordinator.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile coordinator.ext -out coordinator.pem 2>/dev/null
rm -f coordinator.csr coordinator.ext ca.srl
openssl rand -hex 32 > token
chmod 0644 ca.pem coordinator.pem
echo "wrote ${out}/{ca.pem,ca.key,coordinator.pem,coordinator.key,token} for ${san}"

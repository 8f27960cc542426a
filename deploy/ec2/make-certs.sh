#!/usr/bin/env bash
# Make the secrets of a codedgd deployment (docs/security.md): a private CA, the
# coordinator's TLS certificate, a client certificate per role, and a random token per role.
#
#   deploy/ec2/make-certs.sh OUT_DIR [SERVER_NAME] [SERVER_IP...]
#
# SERVER_NAME (default coordinator.codedgd.internal) is the name workers verify
# (CODEDGD_TLS_SERVER_NAME); it does not have to resolve in DNS. Any SERVER_IP is added to
# the certificate too. OUT_DIR gets:
#   ca.pem, ca.key            the CA (keep ca.key offline)
#   coordinator.pem, .key     the coordinator's certificate (serverAuth, SERVER_NAME)
#   worker.pem, .key          client certificate of the workers: subject OU=worker; also
#                             serves their Peer service (name worker.codedgd.internal)
#   operator.pem, .key        client certificate of the operators: subject OU=operator
#   worker.token              the workers' token (coordinator: --worker-token-file;
#                             workers: --token-file)
#   operator.token            the operators' token (coordinator: --operator-token-file;
#                             codedgd submit/status/...: --token-file)
#   token                     a link to operator.token (the name of the single token
#                             earlier versions made)
# A coordinator given --tls-ca ca.pem requires a client certificate and limits a worker
# certificate to Connect, an operator certificate to the client methods. Needs openssl.
set -euo pipefail
out="${1:?usage: make-certs.sh OUT_DIR [SERVER_NAME] [SERVER_IP...]}"
name="${2:-coordinator.codedgd.internal}"
shift $(( $# >= 2 ? 2 : 1 ))
san="DNS:${name}"
for ip in "$@"; do san="${san},IP:${ip}"; done
days=825

mkdir -p "$out"
cd "$out"
umask 077

# issue NAME SUBJECT EXTENSIONS: NAME.key and NAME.pem, signed by the CA.
issue() {
    openssl req -newkey rsa:3072 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf '%b' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=codedgd CA" \
    -keyout ca.key -out ca.pem 2>/dev/null
issue coordinator "/CN=${name}" "subjectAltName=${san}\nextendedKeyUsage=serverAuth\n"
issue worker "/O=codedgd/OU=worker/CN=codedgd worker" \
    "subjectAltName=DNS:worker.codedgd.internal\nextendedKeyUsage=clientAuth,serverAuth\n"
issue operator "/O=codedgd/OU=operator/CN=codedgd operator" "extendedKeyUsage=clientAuth\n"
rm -f ca.srl
openssl rand -hex 32 > worker.token
openssl rand -hex 32 > operator.token
ln -sf operator.token token
chmod 0644 ca.pem coordinator.pem worker.pem operator.pem
echo "wrote ${out}/{ca,coordinator,worker,operator}.{pem,key}, worker.token and" \
    "operator.token (token -> operator.token) for ${san}"

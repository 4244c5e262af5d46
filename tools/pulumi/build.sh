#!/usr/bin/env bash
# Builds the Pulumi engine pinned in go.mod into $SKYWARD_HOME/pulumi/<version>/bin (outside the
# repo) and puts the dynamic-provider launcher next to it. Skips the build when that binary, or a
# `pulumi` on PATH of the same version or newer, already exists. Needs Go and the Go module proxy.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSION=$(awk '$1 == "github.com/pulumi/pulumi/pkg/v3" { print $2 }' "$HERE/go.mod")
HOME_DIR=${SKYWARD_HOME:-$HOME/.skyward}
DEST="$HOME_DIR/pulumi/$VERSION/bin"
say() { printf '\033[1m[engine]\033[0m %s\n' "$*" >&2; }

mkdir -p "$DEST"
install -m 0755 "$HERE/pulumi-resource-pulumi-python" "$DEST/pulumi-resource-pulumi-python"
# Our Python language host (the Go one is not available from the module proxy): for stacks/.
install -m 0755 "$HERE/pulumi-language-python" "$DEST/pulumi-language-python"

version_of() { PULUMI_SKIP_UPDATE_CHECK=true "$1" version 2>/dev/null | tr -d '[:space:]'; }
at_least() { [ "$(printf '%s\n%s\n' "${VERSION#v}" "${1#v}" | sort -V | head -1)" = "${VERSION#v}" ]; }

if [ -x "$DEST/pulumi" ] && [ "$(version_of "$DEST/pulumi")" = "$VERSION" ]; then
    exit 0
fi
if on_path=$(command -v pulumi 2>/dev/null) && [ "$on_path" != "$DEST/pulumi" ]; then
    found=$(version_of "$on_path")
    if [ -n "$found" ] && at_least "$found"; then
        say "using $on_path ($found), no build needed"
        exit 0
    fi
fi

command -v go >/dev/null 2>&1 || {
    say "Go is needed to build the Pulumi engine $VERSION: install Go 1.25 or newer and run again"
    exit 1
}
say "building pulumi $VERSION from Go modules into $DEST (first time only; a few minutes)"
start=$(date +%s)
tmp=$(mktemp -d "$DEST/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(
    cd "$HERE"
    export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
    go build -trimpath -tags osusergo,grpcnotrace \
        -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$VERSION" \
        -o "$tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
)
[ "$(version_of "$tmp/pulumi")" = "$VERSION" ] || { say "built binary does not report $VERSION"; exit 1; }
mv -f "$tmp/pulumi" "$DEST/pulumi"
say "pulumi $VERSION built in $(( $(date +%s) - start ))s"

#!/usr/bin/env bash
# Builds the Pulumi engine pinned in go.mod into $SKYWARD_HOME/pulumi/<version>/bin (outside the
# repo) and puts the dynamic-provider launcher and our language host next to it. The engine is
# built with same_user_grpc.go.overlay added to its gRPC package, so that every gRPC server of
# the engine serves this user only; `pulumi.guard` beside the binary records which guard it was
# built with, and skyward_iac refuses an engine without it. Skips the build when that binary and guard
# are already there. Needs Go and the Go module proxy.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSION=$(awk '$1 == "github.com/pulumi/pulumi/pkg/v3" { print $2 }' "$HERE/go.mod")
HOME_DIR=${SKYWARD_HOME:-$HOME/.skyward}
DEST="$HOME_DIR/pulumi/$VERSION/bin"
GUARD=$(sha256sum "$HERE/same_user_grpc.go.overlay" | cut -c1-16)
say() { printf '\033[1m[engine]\033[0m %s\n' "$*" >&2; }

mkdir -p "$DEST"
install -m 0755 "$HERE/pulumi-resource-pulumi-python" "$DEST/pulumi-resource-pulumi-python"
# Our Python language host (the Go one is not available from the module proxy): for stacks/.
install -m 0755 "$HERE/pulumi-language-python" "$DEST/pulumi-language-python"

version_of() { PULUMI_SKIP_UPDATE_CHECK=true "$1" version 2>/dev/null | tr -d '[:space:]'; }

if [ -x "$DEST/pulumi" ] && [ "$(version_of "$DEST/pulumi")" = "$VERSION" ] \
        && [ "$(cat "$DEST/pulumi.guard" 2>/dev/null)" = "$GUARD" ]; then
    exit 0
fi

command -v go >/dev/null 2>&1 || {
    say "Go is needed to build the Pulumi engine $VERSION: install Go 1.26.6 or newer and run again"
    exit 1
}
say "building pulumi $VERSION from Go modules into $DEST (first time only; a few minutes)"
start=$(date +%s)
tmp=$(mktemp -d "$DEST/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(
    export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
    # The guard joins gRPC's own package. Go allows no overlay inside the module cache, so the
    # build runs in a copy of this module whose go.mod replaces gRPC with a copy of the pinned
    # gRPC module that has the one added file.
    grpc_dir=$(cd "$HERE" && go mod download -json google.golang.org/grpc | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$grpc_dir" ] || { say "could not find the gRPC module"; exit 1; }
    mkdir -p "$tmp/module"
    cp "$HERE/go.mod" "$HERE/go.sum" "$tmp/module/"
    cp -r "$grpc_dir" "$tmp/grpc" && chmod -R u+w "$tmp/grpc"
    cp "$HERE/same_user_grpc.go.overlay" "$tmp/grpc/skyward_same_user.go"
    cd "$tmp/module"
    go mod edit -replace "google.golang.org/grpc=$tmp/grpc"
    go build -trimpath -tags osusergo,grpcnotrace \
        -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$VERSION" \
        -o "$tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
)
[ "$(version_of "$tmp/pulumi")" = "$VERSION" ] || { say "built binary does not report $VERSION"; exit 1; }
mv -f "$tmp/pulumi" "$DEST/pulumi"
echo "$GUARD" > "$DEST/pulumi.guard"
say "pulumi $VERSION built in $(( $(date +%s) - start ))s"

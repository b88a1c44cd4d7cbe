#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler from Debian's `kubernetes` source package
# for the end-to-end tests (tests/e2e/) and `make bench-e2e`; etcd comes from
# Debian's etcd-server. The binaries are cached in a directory keyed by the source
# package's version, so a second run builds nothing:
#
#   $KSSCHED_E2E_CACHE/<version>/bin/{kube-apiserver,kube-scheduler}
#
# Prints that bin directory on its last line. Needs root for apt-get (as CI is);
# a cold build takes 4-8 minutes on 2 cores. Exits 3 when the Debian source cannot
# be had (no deb-src reachable), the one case the e2e tests may skip, loudly.
set -euo pipefail

CACHE=${KSSCHED_E2E_CACHE:-${HOME:-/root}/.cache/ks-scheduler/control-plane}
export DEBIAN_FRONTEND=noninteractive

log() { echo "build-control-plane: $*" >&2; }

have_tools() { command -v go >/dev/null && command -v etcd >/dev/null && command -v dpkg-source >/dev/null; }

# `apt-get source` needs a deb-src entry for the running release: add one next to
# the deb entries if there is none.
ensure_deb_src() {
  if grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ ||
    grep -qs '^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list; then
    return 0
  fi
  log "adding deb-src entries for $(. /etc/os-release; echo "$VERSION_CODENAME")"
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && sed -i 's/^Types: deb$/Types: deb deb-src/' "$f"
  done
  if [ -s /etc/apt/sources.list ]; then
    sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >/etc/apt/sources.list.d/ks-scheduler-src.list
  fi
  apt-get update -qq
}

source_version() {
  apt-cache showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2}' | sort -V | tail -n 1
}

cached_any() { ls -d "$CACHE"/*/bin/kube-apiserver >/dev/null 2>&1; }
if [ "$(id -u)" -ne 0 ] && ! have_tools; then
  if cached_any; then
    dirname "$(ls -d "$CACHE"/*/bin/kube-apiserver | sort -V | tail -n 1)"
    exit 0
  fi
  log "not root: cannot install golang-go, etcd-server and dpkg-dev (run as root, or install them)"
  exit 3
fi
if ! have_tools; then
  log "installing golang-go, etcd-server and dpkg-dev"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends golang-go etcd-server dpkg-dev \
    golang-github-modern-go-reflect2-dev >/dev/null
fi
if [ ! -d /usr/share/gocode/src/github.com/modern-go/reflect2 ]; then
  apt-get install -y -qq --no-install-recommends golang-github-modern-go-reflect2-dev >/dev/null
fi

ensure_deb_src
VERSION=$(source_version)
if [ -z "$VERSION" ]; then
  apt-get update -qq || true
  VERSION=$(source_version)
fi
if [ -z "$VERSION" ]; then
  log "the Debian source package 'kubernetes' cannot be had on this machine"
  exit 3
fi
OUT="$CACHE/$VERSION"
if [ -x "$OUT/bin/kube-apiserver" ] && [ -x "$OUT/bin/kube-scheduler" ]; then
  log "cached: $OUT/bin (kubernetes $VERSION)"
  echo "$OUT/bin"
  exit 0
fi

WORK=$(mktemp -d /tmp/ks-control-plane.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
log "building kubernetes $VERSION in $WORK (a cold build takes 4-8 minutes on 2 cores)"
cd "$WORK"
if ! apt-get source -qq --download-only kubernetes="$VERSION" >/dev/null 2>&1; then
  log "apt-get source kubernetes=$VERSION failed"
  exit 3
fi
dpkg-source -x --no-check kubernetes_*.dsc src >/dev/null
SRC="$WORK/src"

# GOPATH mode: the tree at src/k8s.io/kubernetes of a GOPATH, no modules, no cgo.
export GOPATH="$WORK/gopath" GO111MODULE=off CGO_ENABLED=0 GOFLAGS= GOCACHE="$WORK/gocache"
mkdir -p "$GOPATH/src/k8s.io"
ln -s "$SRC" "$GOPATH/src/k8s.io/kubernetes"
PKG=k8s.io/kubernetes
cd "$GOPATH/src/$PKG"

# reflect2 v1.0.1 crashes kube-apiserver built with Go >= 1.18 on the first merge
# patch: Debian's packaged v1.0.2 replaces it.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod

# kube-apiserver needs pkg/generated/openapi: the vendored openapi-gen over every
# package that asks for it with a +k8s:openapi-gen= tag.
log "generating pkg/generated/openapi"
go build -o "$WORK/openapi-gen" "$PKG/vendor/k8s.io/kube-openapi/cmd/openapi-gen"
# -R: vendor/k8s.io/* are symlinks into staging/.
DIRS=$(grep -Rl --include='*.go' '^// *+k8s:openapi-gen=' pkg vendor 2>/dev/null |
  grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
    -e '/testdata/' -e '_test.go$' |
  xargs -n1 dirname | LC_ALL=C sort -u | sed "s|^|$PKG/|" | paste -sd, -)
"$WORK/openapi-gen" --logtostderr -v 0 \
  -i "$DIRS" \
  -p "$PKG/pkg/generated/openapi" \
  -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
  -r "$WORK/violations.report" >/dev/null 2>"$WORK/openapi-gen.log" || {
  tail -n 20 "$WORK/openapi-gen.log" >&2
  exit 1
}

# The version flags on both packages: otherwise /version answers v0.0.0.
UPSTREAM=${VERSION#*really}
UPSTREAM=${UPSTREAM%%-*}
MAJOR=${UPSTREAM%%.*}
MINOR=$(echo "$UPSTREAM" | cut -d. -f2)
LDFLAGS="-s -w"
for p in vendor/k8s.io/client-go/pkg/version vendor/k8s.io/component-base/version; do
  LDFLAGS+=" -X $PKG/$p.gitVersion=v$UPSTREAM -X $PKG/$p.gitMajor=$MAJOR"
  LDFLAGS+=" -X $PKG/$p.gitMinor=$MINOR -X $PKG/$p.gitTreeState=clean"
  LDFLAGS+=" -X $PKG/$p.buildDate=1970-01-01T00:00:00Z"
done

mkdir -p "$WORK/bin"
for cmd in kube-apiserver kube-scheduler; do
  log "go build $cmd"
  go build -ldflags "$LDFLAGS" -o "$WORK/bin/$cmd" "$PKG/cmd/$cmd"
done
"$WORK/bin/kube-apiserver" --version >&2

mkdir -p "$CACHE"
rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
mv "$WORK/bin" "$OUT.tmp/bin"
echo "$VERSION" >"$OUT.tmp/VERSION"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
log "built: $OUT/bin"
echo "$OUT/bin"

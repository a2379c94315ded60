#!/usr/bin/env bash
# Builds the devio-server OCI image without a container registry: a root
# filesystem made by mmdebstrap from Debian's archive (fetched over the network
# on the first run, cached afterwards) with the runtime libraries the binaries link
# (found by ldd and dpkg -S on this Debian 12 machine), the binaries already
# built by Bazel, and podman (or buildah) over deploy/image/Containerfile.
# Must never pull from a container registry; the root filesystem is cached
# under ~/.cache/devio/image, keyed by everything that goes into it.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/image/build.sh [--flavour cpu|cuda] [--bin DIR] [--tag IMAGE:TAG]
                             [--save FILE] [--cache DIR]

  --flavour cpu   the reference backend only (default)
  --flavour cuda  also libdevio-backend-cuda.so (built by `bazel build //kernels/...`
                  where the CUDA toolkit is; it links the CUDA runtime statically,
                  so the image needs only the driver that the GPU node mounts)
  --bin DIR       Bazel's output tree holding service/devio-server,
                  tools/mkmodel/devio-mkmodel, ref/devio-ref [bazel-bin]
  --tag IMAGE:TAG the image name [localhost/devio:VERSION-FLAVOUR]
  --save FILE     also write the image as an OCI archive (podman save)
  --cache DIR     where root filesystems are kept [~/.cache/devio/image]
Prints the image name on the last line of standard output.
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/deploy/image"
flavour=cpu bin="$ROOT/bazel-bin" tag="" save="" cache="${XDG_CACHE_HOME:-$HOME/.cache}/devio/image"

log() { printf 'devio-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --flavour) flavour=${2:?}; shift 2 ;;
        --bin) bin=${2:?}; shift 2 ;;
        --tag) tag=${2:?}; shift 2 ;;
        --save) save=${2:?}; shift 2 ;;
        --cache) cache=${2:?}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
case "$flavour" in cpu|cuda) ;; *) die "--flavour must be cpu or cuda" ;; esac

for t in mmdebstrap ldd dpkg-query sha256sum; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found (deploy/devio.sh setup installs it)"
done
builder=""
for t in podman buildah; do
    if command -v "$t" >/dev/null 2>&1; then builder=$t; break; fi
done
[ -n "$builder" ] || die "neither podman nor buildah found (deploy/devio.sh setup installs podman)"

bins=("$bin/service/devio-server" "$bin/tools/mkmodel/devio-mkmodel" "$bin/ref/devio-ref")
[ "$flavour" = cpu ] || bins+=("$bin/kernels/libdevio-backend-cuda.so")
for b in "${bins[@]}"; do
    [ -f "$b" ] || die "missing $b (build first: bazel build //service:devio-server //tools/mkmodel:devio-mkmodel //ref:devio-ref, and //kernels/... for cuda)"
done
version=$("$bin/service/devio-server" --version | awk '{print $2}')
[ -n "$version" ] || die "devio-server --version printed no version"
[ -n "$tag" ] || tag="localhost/devio:$version-$flavour"

# The Debian packages that hold every library the binaries load (libc6 and the
# rest come from the dynamic section, resolved on this machine by ldd).
libs=$(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
[ -n "$libs" ] || die "ldd found no libraries in ${bins[*]}"
pkgs=$(for l in $libs; do
           dpkg-query -S "$(readlink -f "$l")" 2>/dev/null || dpkg-query -S "$l"
       done | cut -d: -f1 | sort -u | tr '\n' ',' | sed 's/,$//')
[ -n "$pkgs" ] || die "dpkg found no package owning ${libs//$'\n'/ }"
# bash and grep are Essential: the health check runs on them.

# The host's own apt sources, so the libraries match the versions the binaries
# were linked against; mmdebstrap reads standard input as sources otherwise.
sources=http://deb.debian.org/debian
for s in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$s" ] && grep -qE '^[^#]*(deb|URIs:)' "$s"; then sources=$s; break; fi
done

# Everything that goes into the root filesystem names its cache entry.
RECIPE_VERSION=1
key=$( { echo "$RECIPE_VERSION $pkgs"; cat "$sources" 2>/dev/null || echo "$sources"; } \
       | sha256sum | cut -c1-16)
rootfs="$cache/rootfs-$key.tar"
mkdir -p "$cache"
if [ -s "$rootfs" ]; then
    log "root filesystem from cache: $rootfs"
else
    log "making the root filesystem (Debian 12: $pkgs) into $rootfs"
    partial="$rootfs.partial.$$"
    rm -f "$partial"
    mmdebstrap --quiet --variant=essential --format=tar \
        --include="$pkgs" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='echo "devio:x:10001:10001:devio:/var/lib/devio:/usr/sbin/nologin" >>"$1/etc/passwd"' \
        --customize-hook='echo "devio:x:10001:" >>"$1/etc/group"' \
        --customize-hook='install -d -m 0750 -o 10001 -g 10001 "$1/var/lib/devio" "$1/var/lib/devio/adapters"' \
        --customize-hook='install -d -m 0755 "$1/models"' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
        bookworm "$partial" "$sources" </dev/null >&2 \
        || die "mmdebstrap failed (it needs Debian's archive over the network on its first run)"
    mv "$partial" "$rootfs"
    # Older entries of other keys are left behind by a change of packages.
    find "$cache" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$key.tar" -mtime +7 -delete
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/devio-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/bin"
# A hard link where the cache shares the file system, else a copy.
ln "$rootfs" "$ctx/rootfs.tar" 2>/dev/null || cp "$rootfs" "$ctx/rootfs.tar"
install -m 0755 "${bins[@]}" "$HERE/devio-healthcheck" "$ctx/bin/"
cp "$HERE/Containerfile" "$ctx/Containerfile"

log "building $tag with $builder"
# Docker format: OCI image configs have no HEALTHCHECK. No intermediate layers:
# every step but ADD and COPY is metadata, and they would pile up untagged.
"$builder" build --format docker --layers=false \
    --build-arg "DEVIO_VERSION=$version" --build-arg "DEVIO_FLAVOUR=$flavour" \
    -t "$tag" -f "$ctx/Containerfile" "$ctx" </dev/null >&2
if [ -n "$save" ]; then
    log "saving $tag to $save"
    rm -f "$save"
    if [ "$builder" = podman ]; then
        podman save --format oci-archive -o "$save" "$tag" </dev/null >&2
    else
        buildah push "$tag" "oci-archive:$save:$tag" </dev/null >&2
    fi
fi
echo "$tag"

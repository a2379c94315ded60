#!/usr/bin/env bash
# Builds the devio-server OCI image without a container registry: a root
# filesystem made by mmdebstrap from Debian's archive (fetched over the network
# on the first run, cached afterwards) with the runtime libraries the binaries link
# (found by ldd and dpkg -S on this Debian 12 machine), the binaries already
# built by Bazel, and podman (or buildah) over deploy/image/Containerfile.
# --flavour openai builds the OpenAI-compatible example's image instead
# (Containerfile.openai): Debian's python3 and packages, the two wheels of
# openai-wheels.txt that Debian 12 lacks or has too old (pinned by hash, fetched
# by pip once), and the example with the Python sources it imports.
# Must never pull from a container registry; root filesystems and wheels are
# cached under ~/.cache/devio/image, keyed by everything that goes into them.
# The hooks given to mmdebstrap in single quotes expand "$1" (the root
# filesystem) when mmdebstrap runs them, not here:
# shellcheck disable=SC2016
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/image/build.sh [--flavour cpu|cuda|openai] [--bin DIR] [--tag IMAGE:TAG]
                             [--save FILE] [--cache DIR]

  --flavour cpu   the reference backend only (default)
  --flavour cuda  also libdevio-backend-cuda.so (built by `bazel build //kernels/...`
                  where the CUDA toolkit is; it links the CUDA runtime statically,
                  so the image needs only the driver that the GPU node mounts)
  --flavour openai  examples/openai/serve.py, the OpenAI-compatible server that
                  drives devio-servers (localhost/devio-openai:VERSION); no binaries
  --bin DIR       Bazel's output tree holding service/devio-server,
                  tools/mkmodel/devio-mkmodel, ref/devio-ref [bazel-bin]
  --tag IMAGE:TAG the image name [localhost/devio:VERSION-FLAVOUR,
                  localhost/devio-openai:VERSION for openai]
  --save FILE     also write the image as an OCI archive (podman save)
  --cache DIR     where root filesystems and wheels are kept [~/.cache/devio/image]
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
case "$flavour" in cpu|cuda|openai) ;; *) die "--flavour must be cpu, cuda or openai" ;; esac

for t in mmdebstrap ldd dpkg-query sha256sum tar; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found (deploy/devio.sh setup installs it)"
done
builder=""
for t in podman buildah; do
    if command -v "$t" >/dev/null 2>&1; then builder=$t; break; fi
done
[ -n "$builder" ] || die "neither podman nor buildah found (deploy/devio.sh setup installs podman)"

# What the root filesystem holds besides Essential (bash and grep, which the
# devio health check runs on), and the recipe podman builds from.
state_hook=(--customize-hook='install -d -m 0750 -o 10001 -g 10001 "$1/var/lib/devio"'
            --customize-hook='install -d -m 0750 -o 10001 -g 10001 "$1/var/lib/devio/adapters"')
if [ "$flavour" = openai ]; then
    python3 -m pip --version >/dev/null 2>&1 || die "no python3 -m pip (it installs the wheels)"
    version=$(sed -n 's/^#define DEVIO_VERSION "\(.*\)"$/\1/p' "$ROOT/common/version.h")
    [ -n "$version" ] || die "no DEVIO_VERSION in common/version.h"
    [ -n "$tag" ] || tag="localhost/devio-openai:$version"
    # Debian 12's python3 (3.11), starlette 0.26, jinja2 3.1, numpy 1.24,
    # click and h11 for uvicorn, and libstdc++6 for tokenizers' Rust library.
    # uvicorn (Debian's 0.17 lacks the timeout_graceful_shutdown that serve.py
    # sets) and tokenizers (not in Debian 12) are the wheels of
    # openai-wheels.txt, x86-64 ones.
    [ "$(dpkg --print-architecture)" = amd64 ] || die "--flavour openai: x86-64 (amd64) only"
    pkgs=python3,python3-starlette,python3-jinja2,python3-numpy,python3-click,python3-h11,libstdc++6
    containerfile=Containerfile.openai
    state_hook=()   # no state: the example keeps none
else
    bins=("$bin/service/devio-server" "$bin/tools/mkmodel/devio-mkmodel" "$bin/ref/devio-ref")
    [ "$flavour" = cpu ] || bins+=("$bin/kernels/libdevio-backend-cuda.so")
    for b in "${bins[@]}"; do
        [ -f "$b" ] || die "missing $b (build first: bazel build //service:devio-server //tools/mkmodel:devio-mkmodel //ref:devio-ref, and //kernels/... for cuda)"
    done
    version=$("$bin/service/devio-server" --version | awk '{print $2}')
    [ -n "$version" ] || die "devio-server --version printed no version"
    [ -n "$tag" ] || tag="localhost/devio:$version-$flavour"

    # The Debian packages that hold every library the binaries load (libc6 and
    # the rest come from the dynamic section, resolved on this machine by ldd).
    libs=$(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
    [ -n "$libs" ] || die "ldd found no libraries in ${bins[*]}"
    pkgs=$(for l in $libs; do
               dpkg-query -S "$(readlink -f "$l")" 2>/dev/null || dpkg-query -S "$l"
           done | cut -d: -f1 | sort -u | tr '\n' ',' | sed 's/,$//')
    [ -n "$pkgs" ] || die "dpkg found no package owning ${libs//$'\n'/ }"
    containerfile=Containerfile
fi

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
        "${state_hook[@]}" \
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
# A hard link where the cache shares the file system, else a copy.
ln "$rootfs" "$ctx/rootfs.tar" 2>/dev/null || cp "$rootfs" "$ctx/rootfs.tar"
cp "$HERE/$containerfile" "$ctx/Containerfile"
build_args=(--build-arg "DEVIO_VERSION=$version")
if [ "$flavour" = openai ]; then
    # The wheels go where Debian's python3 looks for local packages, so the
    # image's own Python version decides (and pip checks their Requires-Python).
    pyver=$(tar -tf "$rootfs" | sed -n 's|^\./usr/lib/python\(3\.[0-9]*\)/os\.py$|\1|p' | head -n 1)
    [ -n "$pyver" ] || die "no python3 in $rootfs"
    wheels="$cache/wheels"
    pip_opts=(--quiet --disable-pip-version-check --no-deps --only-binary=:all:
              --platform manylinux_2_17_x86_64 --implementation cp --python-version "$pyver"
              --require-hashes -r "$HERE/openai-wheels.txt")
    install_wheels() {
        python3 -m pip install "${pip_opts[@]}" --no-index --find-links "$wheels" \
            --no-compile --root-user-action=ignore --target "$ctx/site" </dev/null >&2
    }
    mkdir -p "$wheels"
    if ! install_wheels 2>/dev/null; then
        log "fetching the wheels of openai-wheels.txt into $wheels (pip's cache, else PyPI)"
        python3 -m pip download "${pip_opts[@]}" -d "$wheels" </dev/null >&2 \
            || die "pip download failed (PyPI over the network, or pip's cache, on the first run)"
        rm -rf "$ctx/site"
        install_wheels
    fi
    rm -rf "$ctx/site/bin"   # console scripts for the build machine's Python
    # The example and what it imports, laid out as in the repository (its
    # modules find clients/python and tools/gguf two folders above their own).
    for d in examples/openai clients/python/devio_client tools/gguf; do
        mkdir -p "$ctx/app/$d"
        install -m 0644 "$ROOT/$d"/*.py "$ctx/app/$d/"
    done
    build_args+=(--build-arg "PYTHON_VERSION=$pyver")
else
    mkdir "$ctx/bin"
    install -m 0755 "${bins[@]}" "$HERE/devio-healthcheck" "$ctx/bin/"
    build_args+=(--build-arg "DEVIO_FLAVOUR=$flavour")
fi

log "building $tag with $builder"
# Docker format: OCI image configs have no HEALTHCHECK. No intermediate layers:
# every step but ADD and COPY is metadata, and they would pile up untagged.
"$builder" build --format docker --layers=false "${build_args[@]}" \
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

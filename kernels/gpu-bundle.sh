#!/usr/bin/env bash
# kernels/gpu-bundle.sh [DIR]: build what the GPU check runs and lay it out in
# DIR/bin (DIR default .gpu/, ignored by git) the way bazel-bin is laid out,
# with the shared libraries a bare GPU machine may lack in DIR/lib. The GPU
# check then runs there as `bash kernels/gpu-check.sh OUT_DIR .gpu/bin` with
# nothing to build (carry .gpu).
# Must never copy a library the GPU machine's driver provides (libcuda).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DIR=${1:-.gpu}
command -v /usr/local/cuda/bin/nvcc >/dev/null || { echo "gpu-bundle: no nvcc here: the CUDA plugin cannot be built" >&2; exit 1; }
bazel build //ref:devio-ref //tools/mkmodel:devio-mkmodel //tests/bench:devio-bench \
    //kernels:libdevio-backend-cuda.so //kernels:devio-gpu-bw //kernels:devio-gpu-gemm //tests:cuda_test \
    //tests:cuda_fast_kernels_test
rm -rf "$DIR"
mkdir -p "$DIR/bin/ref" "$DIR/bin/tools/mkmodel" "$DIR/bin/tests/bench" "$DIR/bin/kernels" "$DIR/lib"
cp bazel-bin/ref/devio-ref "$DIR/bin/ref/"
cp bazel-bin/tools/mkmodel/devio-mkmodel "$DIR/bin/tools/mkmodel/"
cp bazel-bin/tests/bench/devio-bench "$DIR/bin/tests/bench/"
cp bazel-bin/kernels/libdevio-backend-cuda.so bazel-bin/kernels/devio-gpu-bw bazel-bin/kernels/devio-gpu-gemm \
    "$DIR/bin/kernels/"
cp bazel-bin/tests/cuda_test bazel-bin/tests/cuda_fast_kernels_test "$DIR/bin/tests/"
# The Debian libraries the binaries link that a CUDA image may not have.
for bin in "$DIR"/bin/ref/devio-ref "$DIR"/bin/tests/cuda_test "$DIR"/bin/tests/cuda_fast_kernels_test \
    "$DIR"/bin/kernels/libdevio-backend-cuda.so; do
    ldd "$bin" | awk '/=> \//{print $3}'
done | sort -u | grep -E 'lib(jansson|cmocka)\.so' | xargs -r -I{} cp -L {} "$DIR/lib/"
chmod -R u+w "$DIR"
du -sh "$DIR" | awk '{print "gpu-bundle: " $1 " in '"$DIR"'"}'

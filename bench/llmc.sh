#!/usr/bin/env bash
# llm.c's GPT-2 trainer (train_gpt2.cu, bf16, cuDNN attention) on this GPU, beside tgc:
#   bench/llmc.sh LLMC_SRC CUDNN_FRONTEND_INCLUDE [OUTDIR] [MODELS]
# LLMC_SRC holds llm.c's train_gpt2.cu and llmc/ (its public source, github.com/karpathy/llm.c);
# CUDNN_FRONTEND_INCLUDE is cudnn-frontend's header-only include folder (v1.18 or later). cuDNN itself
# comes from PyTorch's site-packages (nvidia/cudnn). MODELS: llm.c depths, default "d12 d24"
# (GPT-2 124M and 350M, tgc's models/gpt2-124m.yaml and gpt2-350m.yaml). Each trains from llm.c's
# own initialisation on random tokens at batch 16 x 1024 for 40 steps; the median of steps
# 11-40 is printed ("llmc d12: median 31.31 ms a step ..."), with llm.c's own log in OUTDIR.
# LLMC_BIN names a train_gpt2cu built before by this script's commands (the build is skipped);
# CUDNN_DIR a cuDNN folder (include/, lib/) other than PyTorch's.
set -euo pipefail
src=${1:?llm.c source folder} frontend=${2:?cudnn-frontend include folder} out=${3:-.}
models=${4:-d12 d24}
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
cudnn=${CUDNN_DIR:-$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])')}
# NVML (llm.c's GPU logging) from the driver, by its versioned name: no unversioned .so there.
nvml=$(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src"/train_gpt2.cu "$src"/llmc "$work/"
# CUDA 13 dropped the cudaMemAdvise overload that takes a device id; llm.c calls it only on its
# managed-memory fallback (when cudaMalloc fails), so under CUDA 13 that advice is skipped.
sed -i 's|^\(\s*\)cudaCheck_(cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);|#if CUDART_VERSION < 13000\n&\n#endif|' \
  "$work/llmc/cuda_utils.cuh"
flags=(-O3 --use_fast_math -std=c++17 -t=0 --threads=0 -arch=sm_90 -DENABLE_CUDNN -I"$frontend" -I"$cudnn/include")
# (cudnn-frontend from 1.19 on compiles some kernels with NVRTC: -lnvrtc -lcuda.)
libs=(-L"$cudnn/lib" -l:libcudnn.so.9 -lcublas -lcublasLt -lnvrtc -lcuda ${nvml:+"$nvml"})
if [ -n "${LLMC_BIN:-}" ]; then
  cp "$LLMC_BIN" "$work/train_gpt2cu"
  echo "llmc: train_gpt2cu from $LLMC_BIN (built before with these flags)"
else
  start=$(date +%s)
  (cd "$work" && "$nvcc" "${flags[@]}" -c llmc/cudnn_att.cpp -o cudnn_att.o &&
    "$nvcc" "${flags[@]}" train_gpt2.cu cudnn_att.o "${libs[@]}" -o train_gpt2cu) > "$out/llmc-build.txt" 2>&1 ||
    { tail -20 "$out/llmc-build.txt"; exit 1; }
  echo "llmc: built train_gpt2cu in $(( $(date +%s) - start )) s (nvcc sm_90)"
fi
# Random GPT-2 tokens in llm.c's format: a 256-int32 header (magic 20240520, version 1, count),
# then uint16 tokens.
python3 - "$work/tokens.bin" <<'PY'
import struct, sys, random
n = 4 * 1024 * 1024
random.seed(1234)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(random.randrange(50257) for _ in range(n))))
PY
for depth in $models; do
  (cd "$work" && LD_LIBRARY_PATH="$cudnn/lib:${LD_LIBRARY_PATH:-}" ./train_gpt2cu -i tokens.bin -j tokens.bin -e "$depth" \
    -b 16 -t 1024 -d 16384 -x 40 -v 1000 -m 2 -s 0 -h 0 -n 0 -y 0 -l 6e-4 -u 100) > "$out/llmc-$depth.txt" 2>&1 ||
    { tail -20 "$out/llmc-$depth.txt"; exit 1; }
  python3 - "$depth" "$out/llmc-$depth.txt" <<'PY'
import re, sys, statistics
depth, log = sys.argv[1], sys.argv[2]
steps = [(int(m.group(1)), float(m.group(2))) for m in
         (re.search(r"step\s+(\d+)/\d+ \|.*?\| ([0-9.]+) ms \|", line) for line in open(log)) if m]
timed = [ms for step, ms in steps if step > 10]
print(f"llmc {depth}: median {statistics.median(timed):.2f} ms a step over steps 11-{steps[-1][0]} "
      f"(batch 16 x 1024, bf16, cuDNN attention; last loss line: {[l for l in open(log) if 'step' in l][-1].strip()})")
PY
done

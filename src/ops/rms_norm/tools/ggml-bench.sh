#!/usr/bin/env bash
# opgym's RMSNorm next to ggml's CPU RMSNorm (llama.cpp's kernel) on fp32 rows, in one process.
# Optional: ggml is not vendored; fetch it yourself (git clone https://github.com/ggml-org/ggml, or use
# llama.cpp's ggml/ folder) and pass its path.
#
#   src/ops/rms_norm/tools/ggml-bench.sh GGML_SOURCE_DIR [threads ...]     (default threads: 1 2)
#
# Builds opgym (build/, Release) if needed, installs it under build/ggml-bench/opgym, builds ggml's CPU
# backend and the harness in build/ggml-bench/, and prints a Markdown table.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../../.." && pwd)  # the repository root
if [ $# -lt 1 ] || [ ! -f "$1/include/ggml.h" ]; then
  echo "usage: src/ops/rms_norm/tools/ggml-bench.sh GGML_SOURCE_DIR [threads ...]  (GGML_SOURCE_DIR must hold include/ggml.h)" >&2
  exit 2
fi
ggml=$(cd "$1" && pwd)
shift
out="$here/build/ggml-bench"
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$here/build" -j "$(nproc)" --target opgym >/dev/null
cmake --install "$here/build" --prefix "$out/opgym" >/dev/null
cmake -S "$here/src/ops/rms_norm/tools/ggml" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_SOURCE_DIR="$ggml" -DCMAKE_PREFIX_PATH="$out/opgym" >/dev/null
cmake --build "$out/build" -j "$(nproc)" --target opgym_vs_ggml >/dev/null
echo "ggml: $(git -C "$ggml" log -1 --format='%h %cs' 2>/dev/null || echo "$ggml")"
"$out/build/opgym_vs_ggml" "$@"

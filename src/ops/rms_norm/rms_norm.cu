// RMSNorm on NVIDIA GPUs: the numeric contract of opgym::rms_norm (include/opgym/rms_norm.hpp),
// bit for bit with the CPU path on finite inputs, and the CPU front's argument errors.
//
// Why it is shaped this way (docs/CUDA.md has the whole story):
// - The fp32 sum of squares runs in opgym's fixed order: element i adds into partial
//   (i mod kSumLanes) in order of i, and the partials fold by halves. On a GPU that order is a warp:
//   lane l owns partials l + 32k, the fold steps n >= 32 stay inside a lane, and the steps
//   n = 16, 8, 4, 2, 1 (p[j] += p[j + n]) are exactly an xor-shuffle butterfly with those offsets
//   (fp32 addition is commutative, so the upper half of the butterfly holds the same values as the
//   lower half). Every sum is therefore kSumLanes chains of dim / kSumLanes dependent adds, the
//   same chains the CPU computes, and the result is bit-identical to the CPU path.
// - Products and sums are separate roundings (__fmul_rn / __fadd_rn, and the build passes
//   -fmad=false), division and sqrt are correctly rounded (__fdiv_rn, __fsqrt_rn): HF materializes
//   x.pow(2) in fp32 and computes rsqrt as 1 / sqrt.
// - Strategy from the shape:
//   warp_rows (dim <= 2048): a warp per row, 4 rows per block, the row held in registers for a
//     single pass. Lane l loads elements l*V + 32*V*c (V = 2 when every row of x, out and the
//     weight is aligned to two elements: each warp access is then a whole 128-byte line for 16-bit
//     dtypes). With V = 2 and 64 partials lane l owns partials 2l and 2l + 1 outright; with 32,
//     lanes l and l + 16 hold the same partials one step apart, and one shuffle per chunk hands
//     lane l its next element.
//   block_row_smem (larger dims): a block per row; the row is staged in shared memory with
//     16-byte vectors (scalar prefix up to the first aligned element, scalar tail, both computed
//     from the row's address), warp 0 runs the kSumLanes chains from shared memory, then the block
//     scales from shared memory and stores 16-byte vectors of out: one read and one write of HBM.
//   block_row_global (a row larger than shared memory): the same, with the row streamed through
//     shared memory in chunks for the sum and read again from global memory for the scaling.
// - Blocks loop over rows (grid <= 8192 blocks), and every offset is 64-bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/checks.hpp"
#include "core/cuda_dtypes.cuh"
#include "ops/rms_norm/kernel.hpp"
#include "opgym/rms_norm.hpp"

namespace opgym::cuda {

namespace {

// N elements loaded or stored as one access of N * sizeof(S) bytes (2 to 16).
template <class S, int N>
struct alignas(N * sizeof(S)) Pack {
  S v[N];
};
template <int Bytes> struct Word;
template <> struct Word<2> { using T = unsigned short; };
template <> struct Word<4> { using T = unsigned int; };
template <> struct Word<8> { using T = uint2; };
template <> struct Word<16> { using T = uint4; };

// Read-only path (weights: never aliased with out, checked on the host).
template <class S, int N>
__device__ __forceinline__ Pack<S, N> load_ro(const S* p) {
  using W = typename Word<N * sizeof(S)>::T;
  const W w = __ldg(reinterpret_cast<const W*>(p));
  Pack<S, N> r;
  memcpy(&r, &w, sizeof r);
  return r;
}
// Coherent path (x may be out itself).
template <class S, int N>
__device__ __forceinline__ Pack<S, N> load(const S* p) {
  using W = typename Word<N * sizeof(S)>::T;
  const W w = *reinterpret_cast<const W*>(p);
  Pack<S, N> r;
  memcpy(&r, &w, sizeof r);
  return r;
}
template <class S, int N>
__device__ __forceinline__ void store(S* p, const Pack<S, N>& v) {
  using W = typename Word<N * sizeof(S)>::T;
  W w;
  memcpy(&w, &v, sizeof w);
  *reinterpret_cast<W*>(p) = w;
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

constexpr unsigned kFull = 0xffffffffu;

// ---- one call, flattened to rows ------------------------------------------------------------------

struct Params {
  const void* x = nullptr;
  const void* w = nullptr;
  void* out = nullptr;
  int64_t rows = 0, dim = 0;
  int64_t chunk = 0;  // block_row_*: elements staged in shared memory at a time (multiple of kSumLanes)
  float eps = 0.f;    // rounded to fp32, as torch adds it to an fp32 tensor
  float dimf = 0.f;   // float(dim), the divisor of the mean
  bool hf = true;
  bool weight_offset = false;
  bool collapse = true;
  int lead_rank = 0;
  int64_t x_row_stride = 0, out_row_stride = 0;
  int64_t lead_shape[kMaxRank - 1] = {}, x_lead[kMaxRank - 1] = {}, out_lead[kMaxRank - 1] = {};
};

__device__ __forceinline__ void row_offsets(const Params& p, int64_t r, int64_t& xo, int64_t& oo) {
  if (p.collapse) {
    xo = r * p.x_row_stride;
    oo = r * p.out_row_stride;
    return;
  }
  xo = oo = 0;
  for (int d = p.lead_rank - 1; d >= 0; --d) {
    const int64_t n = p.lead_shape[d], i = r % n;
    r /= n;
    xo += i * p.x_lead[d];
    oo += i * p.out_lead[d];
  }
}

// 1 / sqrt(sum / D + eps), every step correctly rounded, as the CPU path.
__device__ __forceinline__ float inv_rms(float sum, const Params& p) {
  const float var = __fdiv_rn(sum, p.dimf);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, p.eps)));
}

// y for one element: hf rounds x * r to the x dtype before the weight; fp32 rounds once at the end.
template <class TX>
__device__ __forceinline__ float scale(float x32, float rinv, float w32, const Params& p) {
  float h = __fmul_rn(x32, rinv);
  if (p.hf) h = TX::to_f32(TX::from_f32(h));
  if (p.weight_offset) w32 = __fadd_rn(w32, 1.0f);
  return __fmul_rn(w32, h);
}

// The opgym sum order (rms_norm.hpp): element i adds into partial (i mod kSumLanes) in order of i,
// then p[j] += p[j + n] for n = kSumLanes / 2, ..., 1. On a warp, lane l holds partials l + 32k
// (k < K) in acc[k]; the steps n >= 32 stay inside a lane, and n = 16, 8, 4, 2, 1 are an
// xor-shuffle butterfly (the upper half of the butterfly holds the same sums as the lower half:
// fp32 addition is commutative). Every lane returns the total.
static_assert(kSumLanes == 32 || kSumLanes == 64, "the CUDA kernels map kSumLanes partials onto one warp");
constexpr int K = kSumLanes / 32;
__device__ __forceinline__ float fold_lanes(float (&acc)[K]) {
  float a = acc[0];
  if constexpr (K == 2) a = __fadd_rn(acc[0], acc[1]);
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) a = __fadd_rn(a, __shfl_xor_sync(kFull, a, o));
  return a;
}

// ---- warp_rows: a warp per row, the row in registers ---------------------------------------------

constexpr int kWarpRowsWarps = 4;  // rows (warps) per block
constexpr int kWarpRowsMaxDim = 2048;
constexpr int64_t kMaxBlocks = 8192;

// V: elements per lane access (1 or 2). EPL: register capacity per lane (elements); dim <= 32 * EPL.
template <class TX, class TW, class TO, int V, int EPL>
__global__ void __launch_bounds__(kWarpRowsWarps * 32) warp_rows_kernel(const __grid_constant__ Params p) {
  using SX = typename TX::S;
  using SW = typename TW::S;
  using SO = typename TO::S;
  constexpr int C = EPL / V;  // chunks of 32 * V elements
  const int lane = threadIdx.x & 31;
  const int D = static_cast<int>(p.dim);
  const SW* w = static_cast<const SW*>(p.w);

  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsWarps + (threadIdx.x >> 5); row < p.rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpRowsWarps) {
    int64_t xo, oo;
    row_offsets(p, row, xo, oo);
    const SX* x = static_cast<const SX*>(p.x) + xo;
    SO* out = static_cast<SO*>(p.out) + oo;

    // Load the whole row (zeros past the end: they add nothing to the sum, as the CPU's zero pad).
    float xv[EPL];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int i = c * 32 * V + lane * V;
#pragma unroll
      for (int k = 0; k < V; ++k) xv[c * V + k] = 0.0f;
      if (c * 32 * V >= D) continue;  // warp-uniform
      if (((i * static_cast<int>(sizeof(SW))) & 127) == 0 && i < D) prefetch_l2(w + i);
      if (V == 2 && i + 1 < D) {
        const Pack<SX, V> v = load<SX, V>(x + i);
#pragma unroll
        for (int k = 0; k < V; ++k) xv[c * V + k] = TX::to_f32(v.v[k]);
      } else if (i < D) {
        xv[c * V] = TX::to_f32(x[i]);
      }
    }

    // Sum of squares in the kSumLanes order.
    float sum;
    if constexpr (V == 1) {
      // Lane l reads elements l + 32c: partial (l + 32c) mod kSumLanes = l + 32 * (c mod K).
      float acc[K] = {};
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (c * 32 < D) acc[c % K] = __fadd_rn(acc[c % K], __fmul_rn(xv[c], xv[c]));
      sum = fold_lanes(acc);
    } else if constexpr (kSumLanes == 64) {
      // Lane l reads elements 2l, 2l + 1 of each 64-element chunk: it owns partials 2l and 2l + 1.
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c * 64 >= D) continue;  // warp-uniform
        a0 = __fadd_rn(a0, __fmul_rn(xv[2 * c], xv[2 * c]));
        a1 = __fadd_rn(a1, __fmul_rn(xv[2 * c + 1], xv[2 * c + 1]));
      }
      // Fold by halves: partial j + n lives in lane (j + n) / 2 = j / 2 + n / 2, same slot.
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) {
        a0 = __fadd_rn(a0, __shfl_xor_sync(kFull, a0, o));
        a1 = __fadd_rn(a1, __shfl_xor_sync(kFull, a1, o));
      }
      sum = __shfl_sync(kFull, __fadd_rn(a0, a1), 0);  // n = 1: p[0] + p[1], in lane 0
    } else {
      // 32 partials: lane l < 16 owns partials 2l and 2l + 1; per 64-element chunk its own pair
      // comes first, then lane l + 16's pair (32 elements later in the same chains).
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c * 64 >= D) continue;  // warp-uniform
        const float s0 = __fmul_rn(xv[2 * c], xv[2 * c]), s1 = __fmul_rn(xv[2 * c + 1], xv[2 * c + 1]);
        const float t0 = __shfl_down_sync(kFull, s0, 16), t1 = __shfl_down_sync(kFull, s1, 16);
        a0 = __fadd_rn(__fadd_rn(a0, s0), t0);
        a1 = __fadd_rn(__fadd_rn(a1, s1), t1);
      }
#pragma unroll
      for (int o = 8; o >= 1; o /= 2) {
        a0 = __fadd_rn(a0, __shfl_xor_sync(kFull, a0, o));
        a1 = __fadd_rn(a1, __shfl_xor_sync(kFull, a1, o));
      }
      sum = __shfl_sync(kFull, __fadd_rn(a0, a1), 0);
    }
    const float rinv = inv_rms(sum, p);

    // Scale and store, same layout as the loads.
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c * 32 * V >= D) continue;
      const int i = c * 32 * V + lane * V;
      if (V == 2 && i + 1 < D) {
        const Pack<SW, V> wv = load_ro<SW, V>(w + i);
        Pack<SO, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = TO::from_f32(scale<TX>(xv[c * V + k], rinv, TW::to_f32(wv.v[k]), p));
        store<SO, V>(out + i, o);
      } else if (i < D) {
        out[i] = TO::from_f32(scale<TX>(xv[c * V], rinv, TW::to_f32(__ldg(w + i)), p));
      }
    }
  }
}

// ---- block_row_*: a block per row, the row staged in shared memory --------------------------------

// Copies x[0, len) into s[shift + i]: 16-byte vectors from the first 16-byte-aligned element, scalar
// prefix and tail. `shift` is x's element phase within 16 bytes, so the vectors land aligned.
template <class SX>
__device__ __forceinline__ void stage(const SX* x, int64_t len, SX* s, int shift) {
  constexpr int VX = 16 / sizeof(SX);
  const int64_t pre = min(static_cast<int64_t>((VX - shift) % VX), len);
  const int64_t nv = (len - pre) / VX, tail = pre + nv * VX;
  for (int64_t i = threadIdx.x; i < pre; i += blockDim.x) s[shift + i] = x[i];
  for (int64_t i = tail + threadIdx.x; i < len; i += blockDim.x) s[shift + i] = x[i];
  const uint4* xv = reinterpret_cast<const uint4*>(x + pre);
  uint4* sv = reinterpret_cast<uint4*>(s + shift + pre);
  for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) sv[k] = xv[k];
}

template <class TX, class TW, class TO>
__global__ void __launch_bounds__(1024) block_row_kernel(const __grid_constant__ Params p) {
  using SX = typename TX::S;
  using SW = typename TW::S;
  using SO = typename TO::S;
  constexpr int VX = 16 / sizeof(SX), VO = 16 / sizeof(SO);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float s_rinv;
  SX* srow = reinterpret_cast<SX*>(smem_raw);
  const int64_t D = p.dim, chunk = p.chunk;
  const bool whole = chunk >= D;  // block_row_smem: the scaling reads shared memory
  const SW* w = static_cast<const SW*>(p.w);

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    int64_t xo, oo;
    row_offsets(p, row, xo, oo);
    const SX* x = static_cast<const SX*>(p.x) + xo;
    SO* out = static_cast<SO*>(p.out) + oo;
    const int shift = static_cast<int>((reinterpret_cast<uintptr_t>(x) / sizeof(SX)) % VX);

    // Sum of squares: warp 0, lane r owns partials r + 32k; chunks start at multiples of
    // kSumLanes, so the chains continue across chunks.
    float acc[K] = {};
    for (int64_t c0 = 0; c0 < D; c0 += chunk) {
      const int64_t len = min(chunk, D - c0);
      stage<SX>(x + c0, len, srow, shift);
      __syncthreads();
      if (threadIdx.x < 32) {
        // Element i = lane + 32m goes to partial lane + 32 * (m mod K).
#pragma unroll 8
        for (int64_t i = threadIdx.x; i < len; i += 32) {
          const float v = TX::to_f32(srow[shift + i]);
          const int k = K == 1 ? 0 : static_cast<int>((i >> 5) & (K - 1));
          acc[k] = __fadd_rn(acc[k], __fmul_rn(v, v));
        }
      }
      if (c0 + chunk < D) __syncthreads();  // the next chunk overwrites shared memory
    }
    if (threadIdx.x < 32) {
      const float sum = fold_lanes(acc);
      if (threadIdx.x == 0) s_rinv = inv_rms(sum, p);
    }
    __syncthreads();
    const float rinv = s_rinv;

    // Scale and store: 16-byte vectors of out from its first aligned element; the weight as vectors
    // too when it has the same phase, else element by element (it stays in L1/L2 across rows).
    auto x_at = [&](int64_t i) { return TX::to_f32(whole ? srow[shift + i] : x[i]); };
    const int ophase = static_cast<int>((reinterpret_cast<uintptr_t>(out) / sizeof(SO)) % VO);
    const int64_t opre = min(static_cast<int64_t>((VO - ophase) % VO), D);
    const int64_t nvo = (D - opre) / VO, otail = opre + nvo * VO;
    const bool wvec = reinterpret_cast<uintptr_t>(w + opre) % (VO * sizeof(SW)) == 0;
    for (int64_t i = threadIdx.x; i < opre; i += blockDim.x)
      out[i] = TO::from_f32(scale<TX>(x_at(i), rinv, TW::to_f32(__ldg(w + i)), p));
    for (int64_t i = otail + threadIdx.x; i < D; i += blockDim.x)
      out[i] = TO::from_f32(scale<TX>(x_at(i), rinv, TW::to_f32(__ldg(w + i)), p));
    for (int64_t k = threadIdx.x; k < nvo; k += blockDim.x) {
      const int64_t i0 = opre + k * VO;
      float wf[VO];
      if (wvec) {
        const Pack<SW, VO> wp = load_ro<SW, VO>(w + i0);
#pragma unroll
        for (int j = 0; j < VO; ++j) wf[j] = TW::to_f32(wp.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < VO; ++j) wf[j] = TW::to_f32(__ldg(w + i0 + j));
      }
      Pack<SO, VO> o;
#pragma unroll
      for (int j = 0; j < VO; ++j) o.v[j] = TO::from_f32(scale<TX>(x_at(i0 + j), rinv, wf[j], p));
      store<SO, VO>(out + i0, o);
    }
    __syncthreads();  // shared memory and s_rinv are reused by the block's next row
  }
}

// ---- host: dtype dispatch and launch --------------------------------------------------------------

template <class Fn>
void with_types(DType xd, DType wd, Fn&& fn) {
  auto tag = [](DType t, auto&& f) {
    switch (t) {
      case DType::float16: return f(DF16{});
      case DType::bfloat16: return f(DBF16{});
      default: return f(DF32{});
    }
  };
  tag(xd, [&](auto tx) {
    tag(wd, [&](auto tw) {
      using TX = decltype(tx);
      using TW = decltype(tw);
      if constexpr (std::is_same_v<TX, TW>) fn(TX{}, TW{}, TX{});
      else fn(TX{}, TW{}, DF32{});
    });
  });
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("opgym::cuda::rms_norm: ") + what + " failed: " + cudaGetErrorString(e));
}

template <class TX, class TW, class TO>
void launch(const RmsNormPlan& plan, const Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.blocks)), block(static_cast<unsigned>(plan.threads));
  if (plan.kernel == RmsNormKernel::warp_rows) {
    if (plan.vec == 2) {
      switch (plan.elems_per_lane) {
        case 4: warp_rows_kernel<TX, TW, TO, 2, 4><<<grid, block, 0, stream>>>(p); break;
        case 16: warp_rows_kernel<TX, TW, TO, 2, 16><<<grid, block, 0, stream>>>(p); break;
        default: warp_rows_kernel<TX, TW, TO, 2, 64><<<grid, block, 0, stream>>>(p); break;
      }
    } else {
      warp_rows_kernel<TX, TW, TO, 1, 64><<<grid, block, 0, stream>>>(p);
    }
  } else {
    auto* k = &block_row_kernel<TX, TW, TO>;
    if (plan.smem_bytes > 48 * 1024) {
      // A host-side attribute, no stream work: allowed while a graph is being captured.
      if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(plan.smem_bytes)) !=
          cudaSuccess)
        check_launch("cudaFuncSetAttribute");
    }
    k<<<grid, block, plan.smem_bytes, stream>>>(p);
  }
  check_launch("kernel launch");
}

// Every row of t starts at a multiple of `elems` elements (given an element-aligned base).
bool rows_aligned(const TensorView& t, int elems) {
  // (A null pointer, planning without data, counts as aligned.)
  if (reinterpret_cast<uintptr_t>(t.data) % (elems * dtype_size(t.dtype)) != 0) return false;
  for (int d = 0; d < t.rank - 1; ++d)
    if (t.shape[d] > 1 && t.strides[d] % elems != 0) return false;
  return true;
}

constexpr size_t kDefaultSmem = 48 * 1024;

}  // namespace

const char* kernel_name(RmsNormKernel k) {
  switch (k) {
    case RmsNormKernel::warp_rows: return "warp_rows";
    case RmsNormKernel::block_row_smem: return "block_row_smem";
    default: return "block_row_global";
  }
}

RmsNormPlan plan_rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out, size_t max_smem) {
  detail::check_view(x, "x", "rms_norm", /*need_data=*/false);
  RmsNormPlan p;
  p.dim = x.last_dim();
  p.rows = x.rows();
  int64_t s;
  p.rows_collapse = detail::leading_collapse(x, s) && detail::leading_collapse(out, s);
  const DType xd = x.dtype;
  if (p.dim <= kWarpRowsMaxDim) {
    p.kernel = RmsNormKernel::warp_rows;
    p.vec = rows_aligned(x, 2) && rows_aligned(out, 2) && rows_aligned(weight, 2) ? 2 : 1;
    p.elems_per_lane = p.vec == 1 ? 64 : p.dim <= 128 ? 4 : p.dim <= 512 ? 16 : 64;
    p.threads = kWarpRowsWarps * 32;
    p.blocks = std::min<int64_t>((p.rows + kWarpRowsWarps - 1) / kWarpRowsWarps, kMaxBlocks);
  } else {
    const size_t es = dtype_size(xd);
    const int vx = static_cast<int>(16 / es);
    p.vec = vx;
    p.threads = p.dim <= 8192 ? 256 : p.dim <= 32768 ? 512 : 1024;
    p.blocks = std::min<int64_t>(p.rows, kMaxBlocks);
    const size_t budget = (max_smem ? max_smem : kDefaultSmem) - 64;  // 64: the block's static s_rinv
    const int64_t whole = (p.dim + 31) / 32 * 32;
    if (static_cast<size_t>(whole + vx) * es <= budget) {
      p.kernel = RmsNormKernel::block_row_smem;
      p.smem_bytes = static_cast<size_t>(whole + vx) * es;
    } else {
      p.kernel = RmsNormKernel::block_row_global;
      // Chunks of at most 32 KiB keep several blocks per SM; a multiple of kSumLanes continues the chains.
      const int64_t chunk =
          std::min<int64_t>((static_cast<int64_t>(budget / es) - vx) / kSumLanes * kSumLanes, 32 * 1024 / es);
      p.smem_bytes = static_cast<size_t>(chunk + vx) * es;
    }
  }
  return p;
}

std::string RmsNormPlan::describe() const {
  std::ostringstream o;
  o << "rms_norm cuda plan\n"
    << "  kernel        " << kernel_name(kernel) << "\n"
    << "  rows          " << rows << " (leading dims " << (rows_collapse ? "collapse to one row stride" : "walked by index")
    << ")\n"
    << "  last dim      " << dim << "\n";
  if (kernel == RmsNormKernel::warp_rows)
    o << "  lane access   " << vec << " element" << (vec > 1 ? "s" : "") << ", " << elems_per_lane
      << " elements per lane in registers\n";
  else
    o << "  vector        " << vec << " elements (16 bytes) of x, scalar prefix/tail per row; shared memory "
      << smem_bytes << " bytes" << (kernel == RmsNormKernel::block_row_global ? " (row streamed in chunks, read twice)" : "")
      << "\n";
  o << "  grid          " << blocks << " blocks of " << threads << " threads\n";
  return o.str();
}

void rms_norm(const TensorView& x, const TensorView& weight, const TensorView& out, const RmsNormOptions& opt,
              CUstream_st* stream) {
  // The CPU front's checks (the same function), then the GPU's own.
  static constexpr const char* op = "rms_norm";
  if (opt.sum_order == SumOrder::torch_cpu)
    throw Error("sum_order", std::string(op) + ": sum_order torch_cpu is the CPU's order; CUDA sums in the lanes64 order "
                             "(pass automatic or lanes64)");
  if (!detail::check_rms_norm_args(x, weight, out, opt)) return;  // nothing to launch
  const int64_t dim = x.last_dim();
  // (Element alignment of every tensor is one of check_view's checks, shared with the CPU front.)

  size_t max_smem = kDefaultSmem;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) check_launch("cudaGetDevice");
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    check_launch("cudaDeviceGetAttribute");
  if (optin > 0) max_smem = static_cast<size_t>(optin);
  const RmsNormPlan plan = plan_rms_norm(x, weight, out, max_smem);

  Params p;
  p.x = x.data;
  p.w = weight.data;
  p.out = out.data;
  p.rows = plan.rows;
  p.dim = dim;
  p.chunk = plan.kernel == RmsNormKernel::block_row_global
                ? static_cast<int64_t>(plan.smem_bytes / dtype_size(x.dtype)) - plan.vec
                : (dim + 31) / 32 * 32;
  p.eps = static_cast<float>(opt.eps);
  p.dimf = static_cast<float>(dim);
  p.hf = opt.mode == NormMode::hf;
  p.weight_offset = opt.weight_offset;
  int64_t xs = 0, os = 0;
  p.collapse = detail::leading_collapse(x, xs) && detail::leading_collapse(out, os);
  p.x_row_stride = xs;
  p.out_row_stride = os;
  p.lead_rank = x.rank - 1;
  for (int d = 0; d < p.lead_rank; ++d) {
    p.lead_shape[d] = x.shape[d];
    p.x_lead[d] = x.strides[d];
    p.out_lead[d] = out.strides[d];
  }
  with_types(x.dtype, weight.dtype, [&](auto tx, auto tw, auto to) {
    launch<decltype(tx), decltype(tw), decltype(to)>(plan, p, stream);
  });
}

}  // namespace opgym::cuda

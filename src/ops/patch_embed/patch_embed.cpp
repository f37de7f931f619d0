// The patch_embed front: the packed weight (header + values), the checks (nothing is written on error), the
// tile permission (asked once per process; whether the CPU has AMX and AVX512-BF16 is the core's cpu_has),
// and the call: blocks of 32 rows x
// groups of 32-channel blocks on the executor, each task packing its rows of x position-major into a scratch
// buffer, running the kernel of its path, then the epilogue (bias, rounding, store).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/checks.hpp"
#include "core/storage.hpp"
#include "opgym/cpu.hpp"
#include "opgym/error.hpp"
#include "opgym/patch_embed.hpp"
#include "ops/patch_embed/kernel.hpp"

namespace opgym {

namespace {
constexpr const char* kOp = "patch_embed";
constexpr char kMagic[8] = {'o', 'p', 'g', 'y', 'm', 'P', 'E', '1'};
constexpr int64_t kHeaderBytes = 64;

Error err(const char* arg, const std::string& what) { return Error(arg, std::string(kOp) + ": " + what); }

// What the packed buffer's first 64 bytes hold (every byte of it covered by `check`).
struct Header {
  char magic[8];
  int32_t form, dtype;
  int64_t oc, ic, npos, value_bytes;
  uint64_t check;
  // derived, not stored: channels padded to even (bf16 forms), output blocks of 32
  int64_t icp() const { return form == static_cast<int32_t>(PatchEmbedForm::fma_chain) ? ic : (ic + 1) / 2 * 2; }
  int64_t ocb() const { return (oc + 31) / 32; }
};
static_assert(sizeof(Header) == 56, "header fits its 64 bytes, no padding inside");

uint64_t header_check(const Header& h) {
  uint64_t v = 1469598103934665603ull;
  auto mix = [&](uint64_t x) { v = (v ^ x) * 1099511628211ull; };
  mix(static_cast<uint64_t>(h.form)), mix(static_cast<uint64_t>(h.dtype));
  for (int64_t x : {h.oc, h.ic, h.npos, h.value_bytes}) mix(static_cast<uint64_t>(x));
  for (char c : h.magic) mix(static_cast<unsigned char>(c));
  return v;
}

int64_t value_bytes(PatchEmbedForm form, int64_t ocb, int64_t npos, int64_t icp) {
  // bf16 forms: [ocb*2][npos][icp/2][16][2] bf16; fma_chain: [ocb*2][npos][ic][16] fp32
  const int64_t elems = ocb * 2 * npos * icp * 16;
  return elems * (form == PatchEmbedForm::fma_chain ? 4 : 2);
}

bool mul_overflows(int64_t a, int64_t b) { return a != 0 && b > INT64_MAX / a; }

// Shape of a pack, checked: the weight view [OC, K] and in_channels.
Header plan(const TensorView& weight, int64_t in_channels, PatchEmbedForm form) {
  detail::check_view(weight, "weight", kOp);
  if (static_cast<int>(form) < 0 || static_cast<int>(form) > 2) throw err("form", "unknown form");
  if (weight.rank != 2)
    throw err("weight", "weight must be [out_channels, K] (K = in_channels * kernel positions), got " +
                            weight.shape_str());
  if (!patch_embed_form_supports(form, weight.dtype))
    throw err("weight", std::string("form ") + patch_embed_form_name(form) + " is defined for bfloat16 only, got " +
                            dtype_name(weight.dtype));
  const int64_t oc = weight.shape[0], k = weight.shape[1];
  if (oc < 1 || k < 1) throw err("weight", "weight must have at least one output channel and one input, got " +
                                               weight.shape_str());
  if (in_channels < 1 || k % in_channels != 0)
    throw err("in_channels", "in_channels must be >= 1 and divide K = " + std::to_string(k) + ", got " +
                                 std::to_string(in_channels));
  if (form == PatchEmbedForm::amx_tile && in_channels > detail::kPeMaxAmxIc)
    throw err("in_channels", "amx_tile takes at most " + std::to_string(detail::kPeMaxAmxIc) +
                                 " channels (one tile row per kernel position), got " + std::to_string(in_channels));
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.form = static_cast<int32_t>(form);
  h.dtype = static_cast<int32_t>(weight.dtype);
  h.oc = oc, h.ic = in_channels, h.npos = k / in_channels;
  if (mul_overflows(h.ocb() * 2 * 16, h.npos) || mul_overflows(h.ocb() * 2 * 16 * h.npos, h.icp() * 4))
    throw err("weight", "the packed weight would not fit in 64 bits of bytes");
  h.value_bytes = value_bytes(form, h.ocb(), h.npos, h.icp());
  h.check = header_check(h);
  return h;
}

Header read_header(const void* packed, int64_t bytes) {
  if (!packed) throw err("packed", "packed is null");
  if (bytes < kHeaderBytes) throw err("packed", "packed holds " + std::to_string(bytes) + " bytes, less than a header");
  Header h;
  std::memcpy(&h, packed, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0 || h.check != header_check(h) || h.form < 0 || h.form > 2 ||
      h.dtype < 0 || h.dtype > 2 || h.oc < 1 || h.ic < 1 || h.npos < 1)
    throw err("packed", "packed is not a patch_embed_pack result (bad header)");
  if (h.value_bytes != value_bytes(static_cast<PatchEmbedForm>(h.form), h.ocb(), h.npos, h.icp()))
    throw err("packed", "packed is not a patch_embed_pack result (its header's sizes disagree)");
  if (h.value_bytes != bytes - kHeaderBytes)
    throw err("packed", "packed holds " + std::to_string(bytes) + " bytes, its header says " +
                            std::to_string(h.value_bytes + kHeaderBytes));
  return h;
}

// ---- the CPU's instructions ---------------------------------------------------------------------

bool request_tile_permission() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

struct Paths {
  bool amx = false, amx_cpu = false, dpbf16 = false;
  std::string text;
};

const Paths& paths() {
  static const Paths p = [] {
    Paths q;
    q.amx_cpu = cpu_has(CpuFeature::amx_bf16) && cpu_supports(CpuIsa::avx512);
    q.amx = q.amx_cpu && request_tile_permission();  // asked once; a refusal leaves the emulation
    q.dpbf16 = cpu_supports(CpuIsa::avx512) && cpu_has(CpuFeature::avx512_bf16);
    return q;
  }();
  return p;
}

// ---- the call -----------------------------------------------------------------------------------

enum class Path { amx, dpbf16, avx512, avx2, scalar };

Path choose_path(PatchEmbedForm form, bool hardware) {
  const CpuIsa isa = active_cpu_isa();
  if (hardware && isa == CpuIsa::avx512) {
    if (form == PatchEmbedForm::amx_tile && paths().amx) return Path::amx;
    if (form == PatchEmbedForm::dot_pairs && paths().dpbf16) return Path::dpbf16;
  }
  return isa == CpuIsa::avx512 ? Path::avx512 : isa == CpuIsa::avx2 ? Path::avx2 : Path::scalar;
}

// Rows [r0, r0 + nr) of x into the scratch, position-major, pad channels and rows past nr zero.
template <class S, class D>
void pack_rows(const detail::PatchEmbedJob& j, int64_t r0, int nr, int64_t icx, D* dst, D (*conv)(S)) {
  const int64_t xr = j.NPOS * icx;
  std::memset(static_cast<void*>(dst), 0, sizeof(D) * static_cast<size_t>(detail::kPeRows * xr));
  for (int r = 0; r < nr; ++r) {
    const S* src = reinterpret_cast<const S*>(j.x) + (r0 + r) * j.x_row;
    D* d = dst + r * xr;
    for (int64_t ic = 0; ic < j.IC; ++ic) {
      const S* s = src + ic * j.NPOS;
      for (int64_t p = 0; p < j.NPOS; ++p) d[p * icx + ic] = conv(s[p]);
    }
  }
}

uint16_t keep16(uint16_t v) { return v; }
float f32_of_f32(float v) { return v; }
float f32_of_bf16(uint16_t v) { return bf16_to_f32(v); }
float f32_of_f16(uint16_t v) { return f16_to_f32(v); }

// VCVTNEPS2BF16: round to nearest even, a denormal input becomes a zero of its sign.
uint16_t bf16_daz(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? static_cast<uint16_t>((f32_bits(v) >> 16) & 0x8000u) : f32_to_bf16(v);
}

// The epilogue of one block: acc [32][32] -> out rows [r0, r0 + nr), channels [32 b, 32 b + 32) within OC.
void store_block(const detail::PatchEmbedJob& j, int64_t r0, int nr, int64_t b, const float* acc) {
  const int64_t c0 = b * detail::kPeOcBlock, nc = std::min<int64_t>(detail::kPeOcBlock, j.OC - c0);
  float bias[detail::kPeOcBlock];
  for (int64_t c = 0; c < nc; ++c) bias[c] = j.bias ? load_as_f32(j.dtype, j.bias, c0 + c) : 0.0f;
  const bool daz_out = j.form != PatchEmbedForm::fma_chain;
  for (int r = 0; r < nr; ++r) {
    const float* a = acc + r * detail::kPeOcBlock;
    char* o = j.out + ((r0 + r) * j.out_row + c0) * static_cast<int64_t>(dtype_size(j.dtype));
    switch (j.dtype) {
      case DType::float32: {
        float* of = reinterpret_cast<float*>(o);
        for (int64_t c = 0; c < nc; ++c) of[c] = j.bias ? a[c] + bias[c] : a[c];
        break;
      }
      case DType::bfloat16: {
        uint16_t* oh = reinterpret_cast<uint16_t*>(o);
        for (int64_t c = 0; c < nc; ++c) {
          const float v = j.bias ? a[c] + bias[c] : a[c];
          oh[c] = daz_out ? bf16_daz(v) : f32_to_bf16(v);
        }
        break;
      }
      case DType::float16: {
        uint16_t* oh = reinterpret_cast<uint16_t*>(o);
        for (int64_t c = 0; c < nc; ++c) oh[c] = f32_to_f16(j.bias ? a[c] + bias[c] : a[c]);
        break;
      }
    }
  }
}

void run(const detail::PatchEmbedJob& j, Executor* executor) {
  const Path path = choose_path(j.form, j.hardware);
  const bool bf16_scratch = path == Path::amx || path == Path::dpbf16;
  const int64_t icx = j.form == PatchEmbedForm::fma_chain ? j.IC : j.ICP;
  const int64_t scratch_elems = detail::kPeRows * j.NPOS * icx;
  const int64_t row_blocks = (j.P + detail::kPeRows - 1) / detail::kPeRows;
  Executor& ex = executor ? *executor : default_executor();
  const int threads = std::max(1, ex.max_threads());
  // Channel groups: enough tasks for the threads (each task packs its rows once per group).
  int64_t groups = 1;
  while (groups < j.OCB && row_blocks * groups < 4 * threads) groups *= 2;
  groups = std::min(groups, j.OCB);
  const int64_t tasks = row_blocks * groups;

  auto work = [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(detail::kPeRows * detail::kPeOcBlock);
    std::vector<float> xf(bf16_scratch ? 0 : static_cast<size_t>(scratch_elems));
    std::vector<uint16_t> xh(bf16_scratch ? static_cast<size_t>(scratch_elems) : 0);
    int64_t packed_block = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t rb = t / groups, g = t % groups;
      const int64_t r0 = rb * detail::kPeRows;
      const int nr = static_cast<int>(std::min<int64_t>(detail::kPeRows, j.P - r0));
      if (packed_block != rb) {
        if (bf16_scratch) pack_rows<uint16_t, uint16_t>(j, r0, nr, icx, xh.data(), keep16);
        else if (j.dtype == DType::float32) pack_rows<float, float>(j, r0, nr, icx, xf.data(), f32_of_f32);
        else if (j.dtype == DType::bfloat16) pack_rows<uint16_t, float>(j, r0, nr, icx, xf.data(), f32_of_bf16);
        else pack_rows<uint16_t, float>(j, r0, nr, icx, xf.data(), f32_of_f16);
        packed_block = rb;
      }
      const int64_t b0 = j.OCB * g / groups, b1 = j.OCB * (g + 1) / groups;
      auto sink = [&](int64_t b, const float* a) { store_block(j, r0, nr, b, a); };
      switch (path) {
        case Path::amx: detail::patch_embed_rows_amx(j, xh.data(), nr, b0, b1, acc.data(), sink); break;
        case Path::dpbf16: detail::patch_embed_rows_dpbf16(j, xh.data(), nr, b0, b1, acc.data(), sink); break;
        case Path::avx512: detail::patch_embed_rows_avx512(j, xf.data(), nr, b0, b1, acc.data(), sink); break;
        case Path::avx2: detail::patch_embed_rows_avx2(j, xf.data(), nr, b0, b1, acc.data(), sink); break;
        case Path::scalar: detail::patch_embed_rows_scalar(j, xf.data(), nr, b0, b1, acc.data(), sink); break;
      }
    }
  };
  if (tasks == 1 || threads <= 1) work(0, tasks);
  else ex.parallel_for(tasks, 1, work);
}

bool ranges_overlap(const void* a, int64_t an, const void* b, int64_t bn) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && pa < pb + static_cast<uintptr_t>(bn) && pb < pa + static_cast<uintptr_t>(an);
}

// Bytes from a view's first element to one past its last (views checked by check_view).
int64_t span_bytes(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return 0;
    last += (t.shape[d] - 1) * t.strides[d];
  }
  return (last + 1) * static_cast<int64_t>(dtype_size(t.dtype));
}

// The call's checks against a packed weight's header; false when there is nothing to compute.
bool check_call(const Header& h, const TensorView& x, const TensorView* bias, const TensorView& out) {
  const DType dt = static_cast<DType>(h.dtype);
  detail::check_view(x, "x", kOp);
  detail::check_view(out, "out", kOp);
  if (x.rank != 2 || x.shape[1] != h.ic * h.npos)
    throw err("x", "x must be [P, " + std::to_string(h.ic * h.npos) + "] (the weight's K), got " + x.shape_str());
  if (x.dtype != dt)
    throw err("x", std::string("x must have the weight's dtype ") + dtype_name(dt) + ", got " + dtype_name(x.dtype));
  if (out.rank != 2 || out.shape[0] != x.shape[0] || out.shape[1] != h.oc)
    throw err("out", "out must be [" + std::to_string(x.shape[0]) + ", " + std::to_string(h.oc) + "], got " +
                         out.shape_str());
  if (out.dtype != dt)
    throw err("out", std::string("out must have the weight's dtype ") + dtype_name(dt) + ", got " + dtype_name(out.dtype));
  if (bias) {
    detail::check_view(*bias, "bias", kOp);
    if (bias->rank != 1 || bias->shape[0] != h.oc)
      throw err("bias", "bias must be [" + std::to_string(h.oc) + "], got " + bias->shape_str());
    if (bias->dtype != dt)
      throw err("bias", std::string("bias must have the weight's dtype ") + dtype_name(dt) + ", got " +
                            dtype_name(bias->dtype));
  }
  if (x.shape[0] == 0) return false;
  detail::check_no_self_overlap(out, "out", kOp);
  detail::check_disjoint(x, "x", out, "out", kOp);
  if (bias) detail::check_disjoint(*bias, "bias", out, "out", kOp);
  return true;
}
}  // namespace

namespace detail {
bool check_patch_embed_unpacked(const TensorView& x, const TensorView& weight, int64_t in_channels,
                                const TensorView* bias, const TensorView& out, PatchEmbedForm form) {
  const Header h = plan(weight, in_channels, form);
  if (!check_call(h, x, bias, out)) return false;
  detail::check_disjoint(weight, "weight", out, "out", kOp);
  return true;
}
}  // namespace detail

const char* patch_embed_form_name(PatchEmbedForm form) {
  switch (form) {
    case PatchEmbedForm::amx_tile: return "amx_tile";
    case PatchEmbedForm::dot_pairs: return "dot_pairs";
    case PatchEmbedForm::fma_chain: return "fma_chain";
  }
  return "?";
}

PatchEmbedForm parse_patch_embed_form(std::string_view name) {
  if (name == "amx_tile") return PatchEmbedForm::amx_tile;
  if (name == "dot_pairs") return PatchEmbedForm::dot_pairs;
  if (name == "fma_chain") return PatchEmbedForm::fma_chain;
  throw err("form", "unknown form '" + std::string(name) + "', expected amx_tile, dot_pairs or fma_chain");
}

bool patch_embed_form_supports(PatchEmbedForm form, DType dtype) {
  return form == PatchEmbedForm::fma_chain ? (dtype == DType::float32 || dtype == DType::float16 ||
                                              dtype == DType::bfloat16)
                                           : dtype == DType::bfloat16;
}

int64_t patch_embed_packed_bytes(const TensorView& weight, int64_t in_channels, PatchEmbedForm form) {
  return kHeaderBytes + plan(weight, in_channels, form).value_bytes;
}

void patch_embed_pack(const TensorView& weight, int64_t in_channels, PatchEmbedForm form, void* packed,
                      int64_t packed_bytes) {
  const Header h = plan(weight, in_channels, form);
  if (!packed) throw err("packed", "packed is null");
  if (packed_bytes != kHeaderBytes + h.value_bytes)
    throw err("packed", "packed must hold " + std::to_string(kHeaderBytes + h.value_bytes) + " bytes, got " +
                            std::to_string(packed_bytes));
  if (ranges_overlap(packed, packed_bytes, weight.data, span_bytes(weight)))
    throw err("packed", "packed overlaps weight");
  unsigned char* base = static_cast<unsigned char*>(packed);
  std::memset(base, 0, static_cast<size_t>(kHeaderBytes));
  std::memcpy(base, &h, sizeof h);
  unsigned char* vals = base + kHeaderBytes;
  const int64_t npos = h.npos, ic = h.ic, icp = h.icp(), blocks16 = h.ocb() * 2;
  const char* w = static_cast<const char*>(weight.data);
  const int64_t es = static_cast<int64_t>(dtype_size(weight.dtype)), ws = weight.strides[0];
  if (form == PatchEmbedForm::fma_chain) {
    float* dst = reinterpret_cast<float*>(vals);
    for (int64_t ob = 0; ob < blocks16; ++ob)
      for (int64_t p = 0; p < npos; ++p)
        for (int64_t i = 0; i < ic; ++i)
          for (int64_t l = 0; l < 16; ++l) {
            const int64_t o = ob * 16 + l;
            *dst++ = o < h.oc ? load_as_f32(weight.dtype, w + o * ws * es, i * npos + p) : 0.0f;
          }
  } else {
    uint16_t* dst = reinterpret_cast<uint16_t*>(vals);  // [ob][p][icp/2][16][2]
    for (int64_t ob = 0; ob < blocks16; ++ob)
      for (int64_t p = 0; p < npos; ++p)
        for (int64_t q = 0; q < icp / 2; ++q)
          for (int64_t l = 0; l < 16; ++l)
            for (int64_t e = 0; e < 2; ++e) {
              const int64_t o = ob * 16 + l, i = 2 * q + e;
              uint16_t v = 0;
              if (o < h.oc && i < ic) std::memcpy(&v, w + (o * ws + i * npos + p) * es, 2);
              *dst++ = v;
            }
  }
}

PatchEmbedPackedInfo patch_embed_packed_info(const void* packed, int64_t packed_bytes) {
  const Header h = read_header(packed, packed_bytes);
  return {static_cast<PatchEmbedForm>(h.form), static_cast<DType>(h.dtype), h.oc, h.ic, h.npos};
}

void patch_embed(const TensorView& x, const void* packed, int64_t packed_bytes, const TensorView* bias,
                 const TensorView& out, const PatchEmbedOptions& options, Executor* executor) {
  const Header h = read_header(packed, packed_bytes);
  if (!check_call(h, x, bias, out)) return;
  if (ranges_overlap(packed, packed_bytes, out.data, span_bytes(out))) throw err("out", "out overlaps packed");
  const DType dt = static_cast<DType>(h.dtype);

  detail::PatchEmbedJob j;
  j.form = static_cast<PatchEmbedForm>(h.form);
  j.dtype = dt;
  j.P = x.shape[0], j.OC = h.oc, j.IC = h.ic, j.NPOS = h.npos, j.ICP = h.icp(), j.OCB = h.ocb();
  j.w = static_cast<const unsigned char*>(packed) + kHeaderBytes;
  j.x = static_cast<const char*>(x.data);
  j.x_row = x.strides[0];
  j.bias = bias ? static_cast<const char*>(bias->data) : nullptr;
  j.out = static_cast<char*>(out.data);
  j.out_row = out.strides[0];
  j.hardware = options.hardware;
  run(j, executor);
}

void patch_embed_unpacked(const TensorView& x, const TensorView& weight, int64_t in_channels, const TensorView* bias,
                          const TensorView& out, PatchEmbedForm form, const PatchEmbedOptions& options,
                          Executor* executor) {
  if (!detail::check_patch_embed_unpacked(x, weight, in_channels, bias, out, form)) return;
  const int64_t n = patch_embed_packed_bytes(weight, in_channels, form);
  std::vector<unsigned char> buf(static_cast<size_t>(n));
  patch_embed_pack(weight, in_channels, form, buf.data(), n);
  patch_embed(x, buf.data(), n, bias, out, options, executor);
}

bool patch_embed_amx_usable() { return paths().amx; }
bool patch_embed_dot_bf16_usable() { return paths().dpbf16; }

const char* patch_embed_paths() {
  static const std::string s = [] {
    const Paths& p = paths();
    const std::string isa = isa_name(active_cpu_isa());
    return std::string("amx_tile: ") +
           (p.amx ? "amx (tiles granted)"
                  : p.amx_cpu ? "emulated on " + isa + " (the OS refused the tile permission)"
                              : "emulated on " + isa + " (no AMX-BF16)") +
           "; dot_pairs: " + (p.dpbf16 ? "avx512_bf16" : "emulated on " + isa) + "; fma_chain: " + isa;
  }();
  return s.c_str();
}

}  // namespace opgym

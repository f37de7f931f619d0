// What every fuzz target (src/**/*_fuzz.cpp, built with -DOPGYM_FUZZ=ON by clang's libFuzzer) shares:
// one byte arena that all of a call's tensors are views into, views drawn from the fuzzer's bytes
// (rank, dims, strides, dtype, byte offset: contiguous, padded, broadcast, negative, overlapping,
// misaligned, empty and oversized ones included), and the check that a call wrote nothing outside the
// views it was given as outputs (nothing at all when it threw). ASan and UBSan catch the rest.
#pragma once
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "opgym/error.hpp"
#include "opgym/tensor.hpp"

namespace opgym::fuzz {

constexpr size_t kArenaBytes = 1 << 16;  // every view must fit: sizes stay small, calls stay fast

struct Arena {
  std::vector<unsigned char> bytes = std::vector<unsigned char>(kArenaBytes + 64);
  int64_t next = 0, last = 0;  // where the next view goes by default (after the previous one); the previous start
  unsigned char* base() { return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64; }
  void fill(FuzzedDataProvider& f) {  // the fuzzer's remaining bytes (NaN, Inf, subnormals), else a pattern
    const std::vector<uint8_t> b = f.ConsumeRemainingBytes<uint8_t>();
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = b.empty() ? static_cast<unsigned char>(i * 131) : b[i % b.size()];
  }
};

// Every draw maps the fuzzer's zero (what FuzzedDataProvider returns once the bytes run out) to the
// common valid choice, and the rare values to the odd ones, so short inputs make calls that compute.
inline DType draw_dtype(FuzzedDataProvider& f) {
  const int d = f.ConsumeIntegralInRange(0, 20);
  return d == 20 ? static_cast<DType>(7) : static_cast<DType>(d % 3);  // mostly valid; now and then not
}

// Bytes from the view's first element to one past its last (0 when empty); -1 when it cannot be
// computed (a rank out of range, negative strides or dims, overflow): such a view is only handed
// over to be refused.
inline int64_t extent(const TensorView& t) {
  if (t.rank < 1 || t.rank > kMaxRank) return -1;
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0 || t.strides[d] < 0) return -1;
    if (t.shape[d] == 0) return 0;
    if (t.shape[d] > (1 << 20) || t.strides[d] > (1 << 20)) return -1;
    last += (t.shape[d] - 1) * t.strides[d];
  }
  return (last + 1) * static_cast<int64_t>(dtype_size(t.dtype));
}

// A view like `like` (its rank and dims, or drawn ones), with drawn strides and byte offset in the
// arena. Its data stays inside the arena whenever its extent can be computed and fits; otherwise it
// is null or the arena's start (the op must refuse it before touching memory).
inline TensorView draw_view(FuzzedDataProvider& f, Arena& a, const TensorView* like, DType dtype, int min_rank = 1) {
  TensorView v;
  v.dtype = dtype;
  const bool same_rank = like && !f.ConsumeBool();
  const int rk = f.ConsumeIntegralInRange(0, 12);
  v.rank = same_rank ? like->rank : rk == 12 ? (f.ConsumeBool() ? 0 : kMaxRank + 1) : min_rank + rk % (5 - min_rank);
  const int rank = v.rank < 0 ? 0 : v.rank > kMaxRank ? kMaxRank : v.rank;
  for (int d = 0; d < rank; ++d) {
    const bool same = like && like->rank == v.rank && f.ConsumeIntegralInRange(0, 7) != 7;
    if (same) {
      v.shape[d] = like->shape[d];
    } else {
      const int64_t n = f.ConsumeIntegralInRange<int64_t>(0, d == rank - 1 ? 299 : 6);
      v.shape[d] = d == rank - 1 ? 128 - n % 128 + n / 128 * 128 : 1 + n;  // zero -> 128-wide rows
    }
    const int odd = f.ConsumeIntegralInRange(0, 60);
    if (odd == 59) v.shape[d] = 0;                                         // empty
    if (odd == 60) v.shape[d] = -1 - f.ConsumeIntegralInRange<int64_t>(0, 3);  // invalid
  }
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int kind = f.ConsumeIntegralInRange(0, 15);
    if (d == rank - 1) v.strides[d] = kind == 15 ? 2 : 1;                    // last dim: contiguous, now and then not
    else if (kind < 10) v.strides[d] = stride;                               // contiguous
    else if (kind < 13) v.strides[d] = stride + f.ConsumeIntegralInRange<int64_t>(1, 9);  // padded rows
    else if (kind == 13) v.strides[d] = 0;                                   // broadcast (self-overlapping)
    else if (kind == 14) v.strides[d] = -stride;                             // negative
    else v.strides[d] = f.ConsumeIntegralInRange<int64_t>(0, 3);             // overlapping rows
    stride = (v.strides[d] > 0 ? v.strides[d] : stride) * (v.shape[d] > 0 ? v.shape[d] : 1);
  }
  const int64_t ext = extent(v);
  const int64_t room = static_cast<int64_t>(kArenaBytes) - (ext > 0 ? ext : 0);
  // By default each view gets its own bytes after the previous one; now and then it lands anywhere
  // (overlaps), on the previous view's start (aliasing), or off its element alignment.
  const int place = f.ConsumeIntegralInRange(0, 20);
  int64_t off = place == 19 && room > 0 ? f.ConsumeIntegralInRange<int64_t>(0, room) : place == 20 ? a.last : a.next;
  if (place == 18) off += 1;
  if (off > room) off = room > 0 ? room : 0;
  v.data = ext < 0 ? a.base() : ext > static_cast<int64_t>(kArenaBytes) ? nullptr : a.base() + off;
  a.last = off;
  a.next = std::min<int64_t>(static_cast<int64_t>(kArenaBytes), (off + (ext > 0 ? ext : 0) + 127) / 64 * 64);
  if (f.ConsumeIntegralInRange(0, 100) == 100) v.data = nullptr;
  return v;
}

// Marks the bytes of v's elements in `mask` (same indexing as the arena's base).
inline void mark(const TensorView& v, Arena& a, std::vector<char>& mask) {
  if (v.data == nullptr || extent(v) <= 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype));
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0, r = i;
    for (int d = v.rank - 1; d >= 0; --d) off += (r % v.shape[d]) * v.strides[d], r /= v.shape[d];
    const int64_t b = static_cast<const unsigned char*>(v.data) - a.base() + off * es;
    for (int64_t k = 0; k < es; ++k)
      if (b + k >= 0 && b + k < static_cast<int64_t>(mask.size())) mask[b + k] = 1;
  }
}

// Copies a view's elements (valid extent) into a contiguous buffer of the same shape and dtype.
inline std::vector<unsigned char> gather(const TensorView& v) {
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype)), n = v.numel();
  std::vector<unsigned char> out(static_cast<size_t>(n * es));
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0, r = i;
    for (int d = v.rank - 1; d >= 0; --d) off += (r % v.shape[d]) * v.strides[d], r /= v.shape[d];
    std::memcpy(out.data() + i * es, static_cast<const unsigned char*>(v.data) + off * es, static_cast<size_t>(es));
  }
  return out;
}

// What a weight of x's last dim looks like (drawn views take it as their `like`).
inline TensorView row_vector_like(const TensorView& x) {
  TensorView w = x;
  w.rank = 1;
  w.shape[0] = x.rank >= 1 && x.rank <= kMaxRank ? x.last_dim() : 1;
  return w;
}

// A contiguous view over `buf` with v's shape and dtype.
inline TensorView contiguous_like(const TensorView& v, std::vector<unsigned char>& buf) {
  return TensorView::contiguous(buf.data(), v.dtype, v.shape.data(), v.rank);
}

// Element i of a and b hold the same value: the same bits, or both NaN (F16C keeps a NaN's payload,
// the scalar conversion does not: any NaN is the answer where NaN is).
inline bool same_elements(DType t, const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) return false;
  const size_t es = dtype_size(t);
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) == 0) continue;
    uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], es), std::memcpy(&y, &b[i], es);
    auto nan = [&](uint32_t u) {
      if (t == DType::float32) return (u & 0x7fffffffu) > 0x7f800000u;
      if (t == DType::bfloat16) return (u & 0x7fffu) > 0x7f80u;
      return (u & 0x7fffu) > 0x7c00u;
    };
    if (!(nan(x) && nan(y))) return false;
  }
  return true;
}

// For a finding's report.
inline void describe(const char* name, const TensorView& v, Arena& a) {
  std::fprintf(stderr, "  %s: %s dtype %d strides [", name, v.shape_str().c_str(), static_cast<int>(v.dtype));
  for (int d = 0; d < v.rank && d < kMaxRank; ++d) std::fprintf(stderr, "%s%lld", d ? ", " : "", static_cast<long long>(v.strides[d]));
  std::fprintf(stderr, "] at byte %lld\n", v.data ? static_cast<long long>(static_cast<const unsigned char*>(v.data) - a.base()) : -1LL);
}

// Whether a view may be read (its elements lie in the arena): only such views are copied.
inline bool readable(const TensorView& v) {
  const int64_t e = extent(v);
  return v.data != nullptr && e >= 0 && e <= static_cast<int64_t>(kArenaBytes) && dtype_size(v.dtype) > 0 &&
         v.numel() > 0;
}

// Aborts (a finding) when a byte outside `outputs` changed, or any byte changed though the call threw.
inline void check_writes(Arena& a, const std::vector<unsigned char>& before, const std::vector<TensorView>& outputs,
                         bool threw) {
  std::vector<char> mask(kArenaBytes, 0);
  if (!threw)
    for (const TensorView& o : outputs) mark(o, a, mask);
  const unsigned char* now = a.base();
  for (size_t i = 0; i < kArenaBytes; ++i)
    if (!mask[i] && now[i] != before[i]) {
      std::fprintf(stderr, "opgym fuzz: byte %zu of the arena written outside the outputs%s\n", i,
                   threw ? " by a call that threw" : "");
      __builtin_trap();
    }
}

// With OPGYM_FUZZ_STATS set, how many calls were refused and how many computed (printed at exit): a
// target whose calls are all refused tests only the checks.
inline void count(const char* refused, bool compared) {
  const bool threw = refused != nullptr;
  if (threw && std::getenv("OPGYM_FUZZ_DEBUG")) std::fprintf(stderr, "refused: %s\n", refused);
  static int64_t n[3] = {0, 0, 0};
  static const bool on = [] {
    if (std::getenv("OPGYM_FUZZ_STATS"))
      std::atexit([] { std::fprintf(stderr, "calls: %lld refused, %lld computed (%lld compared with the golden)\n",
                                    static_cast<long long>(n[0]), static_cast<long long>(n[1]),
                                    static_cast<long long>(n[2])); });
    return true;
  }();
  (void)on;
  ++n[threw ? 0 : 1];
  if (compared) ++n[2];
}

// Runs one call of the op under test: the refusal's text, or empty when it computed.
template <class Fn>
std::string refusal(Fn&& call) {
  try {
    call();
    return {};
  } catch (const Error& e) {
    const std::string why = e.what();
    return why.empty() ? std::string("(an error without text)") : why;
  }
}

inline std::vector<unsigned char> snapshot(Arena& a) { return std::vector<unsigned char>(a.base(), a.base() + kArenaBytes); }

}  // namespace opgym::fuzz

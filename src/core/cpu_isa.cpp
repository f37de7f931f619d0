#include <atomic>
#include <cstdlib>
#include <string>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "opgym/cpu.hpp"
#include "opgym/error.hpp"

namespace opgym {

#if defined(__x86_64__) || defined(__i386__)
namespace {
// F16C and AVX512-FP16 straight from CPUID: clang 14's __builtin_cpu_supports does not know them
// (GCC's does), and the fuzz build is clang's.
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
bool has_avx512fp16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)) != 0;
}
}  // namespace
#endif

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

CpuIsa parse_isa(std::string_view n) {
  if (n == "scalar") return CpuIsa::scalar;
  if (n == "avx2") return CpuIsa::avx2;
  if (n == "avx512") return CpuIsa::avx512;
  throw Error("isa", "unknown instruction set '" + std::string(n) + "', expected scalar, avx2 or avx512");
}

namespace {
bool cpu_supports_uncached(CpuIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::scalar: return true;
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             cpu_supports_uncached(CpuIsa::avx2);
  }
  return false;
#else
  return isa == CpuIsa::scalar;
#endif
}

bool has_amx_bf16() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);  // XTILECFG and XTILEDATA enabled by the OS
#else
  return false;
#endif
}

bool has_avx512_bf16() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") != 0;
#else
  return false;
#endif
}
}  // namespace

bool cpu_supports(CpuIsa isa) {
  static const bool supported[3] = {cpu_supports_uncached(CpuIsa::scalar), cpu_supports_uncached(CpuIsa::avx2),
                                    cpu_supports_uncached(CpuIsa::avx512)};
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 3 && supported[i];
}

bool cpu_has(CpuFeature feature) {
  static const bool bf16 = has_avx512_bf16(), amx = has_amx_bf16();
  switch (feature) {
    case CpuFeature::avx512_bf16: return bf16;
    case CpuFeature::amx_bf16: return amx;
  }
  return false;
}

CpuIsa best_cpu_isa() {
  if (cpu_supports(CpuIsa::avx512)) return CpuIsa::avx512;
  if (cpu_supports(CpuIsa::avx2)) return CpuIsa::avx2;
  return CpuIsa::scalar;
}

namespace {
CpuIsa isa_from_env() {
  const char* env = std::getenv("OPGYM_CPU_ISA");
  if (!env || !*env) return best_cpu_isa();
  CpuIsa isa;
  try {
    isa = parse_isa(env);
  } catch (const Error&) {
    throw Error("OPGYM_CPU_ISA", std::string("OPGYM_CPU_ISA='") + env + "' is not scalar, avx2 or avx512");
  }
  if (!cpu_supports(isa))
    throw Error("OPGYM_CPU_ISA", std::string("OPGYM_CPU_ISA=") + env + " but this CPU lacks it (has: " + cpu_features() + ")");
  return isa;
}
std::atomic<int> forced{-1};
}  // namespace

CpuIsa active_cpu_isa() {
  const int f = forced.load(std::memory_order_relaxed);
  if (f >= 0) return static_cast<CpuIsa>(f);
  static const CpuIsa from_env = isa_from_env();  // read once; a bad value throws on every call
  return from_env;
}

void set_cpu_isa(CpuIsa isa) {
  if (!cpu_supports(isa)) throw Error("isa", std::string("this CPU lacks ") + isa_name(isa) + " (has: " + cpu_features() + ")");
  forced.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* cpu_features() {
  static const std::string s = [] {
    std::string f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const char* names[] = {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512fp16"};
    const bool has[] = {__builtin_cpu_supports("sse4.2") != 0, __builtin_cpu_supports("avx") != 0,
                        __builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("fma") != 0,
                        has_f16c(), __builtin_cpu_supports("avx512f") != 0,
                        __builtin_cpu_supports("avx512bw") != 0, __builtin_cpu_supports("avx512vl") != 0,
                        __builtin_cpu_supports("avx512dq") != 0, __builtin_cpu_supports("avx512bf16") != 0,
                        has_avx512fp16()};
    for (size_t i = 0; i < sizeof has / sizeof has[0]; ++i)
      if (has[i]) f += (f.empty() ? "" : " ") + std::string(names[i]);
#endif
    return f.empty() ? std::string("none") : f;
  }();
  return s.c_str();
}

}  // namespace opgym

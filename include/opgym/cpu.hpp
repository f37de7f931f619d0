// CPU instruction-set dispatch. Chosen once (best the CPU has, or OPGYM_CPU_ISA=scalar|avx2|avx512),
// and overridable at run time so one machine can test every path.
#pragma once
#include <string_view>

namespace opgym {

enum class CpuIsa { scalar, avx2, avx512 };

const char* isa_name(CpuIsa isa);
CpuIsa parse_isa(std::string_view name);  // throws opgym::Error naming OPGYM_CPU_ISA / isa
// avx2 = AVX2+FMA+F16C; avx512 = F+BW+VL+DQ. Read from CPUID once per process (a virtual machine traps
// CPUID: ~10 us a call), so any op may ask on every call.
bool cpu_supports(CpuIsa isa);
// Instructions some ops use beyond an ISA level, read once per process like cpu_supports:
// avx512_bf16 (VDPBF16PS, VCVTNEPS2BF16), amx_bf16 (AMX-TILE + AMX-BF16, with the OS saving the tile state;
// Linux still asks a process to request the tile permission before its first tile instruction).
enum class CpuFeature { avx512_bf16, amx_bf16 };
bool cpu_has(CpuFeature feature);
CpuIsa best_cpu_isa();
// The ISA kernels use now: set_cpu_isa's value, else OPGYM_CPU_ISA, else best_cpu_isa().
CpuIsa active_cpu_isa();
// Forces a path (throws opgym::Error if this CPU lacks it). Affects calls that start afterwards.
void set_cpu_isa(CpuIsa isa);
// Human-readable CPU features relevant to opgym, e.g. "avx2 fma f16c avx512f avx512bw avx512_bf16".
const char* cpu_features();

}  // namespace opgym

// Storage dtypes opgym reads and writes, and torch's promotion rule between them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace opgym {

enum class DType : uint8_t { float32, float16, bfloat16 };

constexpr size_t dtype_size(DType t) { return t == DType::float32 ? 4 : 2; }
const char* dtype_name(DType t);  // "float32", "float16", "bfloat16"
// Accepts the names above and the short forms fp32/fp16/bf16, float/half. Throws opgym::Error otherwise.
DType parse_dtype(std::string_view name, const char* argument = "dtype");

// torch.promote_types for the three dtypes: equal types stay, float32 wins, float16 with bfloat16
// gives float32 (neither holds the other).
constexpr DType promote(DType a, DType b) {
  return a == b ? a : DType::float32;
}

}  // namespace opgym

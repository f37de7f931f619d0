#include "opgym/dtype.hpp"

#include <string>

#include "opgym/error.hpp"

namespace opgym {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
  }
  return "?";
}

DType parse_dtype(std::string_view n, const char* argument) {
  if (n == "float32" || n == "fp32" || n == "float" || n == "f32") return DType::float32;
  if (n == "float16" || n == "fp16" || n == "half" || n == "f16") return DType::float16;
  if (n == "bfloat16" || n == "bf16") return DType::bfloat16;
  throw Error(argument, std::string(argument) + ": unknown dtype '" + std::string(n) +
                            "', expected one of float32, float16, bfloat16");
}

}  // namespace opgym

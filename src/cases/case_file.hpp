// Gym-format case files (PyPTO-Gym's layout), read unchanged:
//   {"op_name"?, "source"?, "description"?, "test_cases": [
//     {"id", "description"?, "seed", "input": {NAME: {"shape", "dtype"} | param ...},
//      "output": {"output": {"shape", "dtype"}} | {"shape", "dtype"} | {NAME: {...}, ...},
//      "rtol", "atol"}]}
// Unknown keys are ignored. Errors name the file and the case id.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "opgym/dtype.hpp"

namespace opgym::cases {

// Ordered, so tensor inputs keep the order of the file (role inference relies on it).
using Json = nlohmann::ordered_json;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::float32;
  int64_t numel() const;
  std::string shape_str() const;
};

struct Case {
  std::string id, description;
  uint64_t seed = 0;
  std::vector<TensorSpec> inputs;  // tensor inputs, in file order
  Json params;                   // every non-tensor input (eps, mrope_section, ...), as written
  std::vector<TensorSpec> outputs; // declared output tensors
  Json output_params;              // every non-tensor entry of "output" (e.g. MRoPE's q_shape, dtype)
  double rtol = 0, atol = 0;
  const TensorSpec* input(std::string_view name) const;
  // A numeric param given as a number or as {"value": number}; throws naming file and case if absent.
  double number_param(std::string_view name, const std::string& file) const;
};

struct CaseFile {
  std::string path, op_name, source, description;
  std::vector<Case> cases;
};

CaseFile load_case_file(const std::string& path);

// Whether v is a JSON integer (a huge literal parses as a float, which nlohmann would cast to an integer
// type with undefined behaviour) or an array of them: what an op's cases.cpp checks before get<int...>().
inline bool is_integer_list(const Json& v) {
  if (!v.is_array()) return false;
  for (const auto& e : v)
    if (!e.is_number_integer()) return false;
  return true;
}
// `path` names the source in errors; op_name falls back to the file name without "_test_cases.json".
CaseFile parse_case_file(const Json& j, const std::string& path);

}  // namespace opgym::cases

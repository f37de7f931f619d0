#include "cases/case_file.hpp"

#include <fstream>
#include <sstream>

#include "opgym/error.hpp"

namespace opgym::cases {

using json = Json;

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorSpec::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const TensorSpec* Case::input(std::string_view name) const {
  for (const auto& t : inputs)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& id, const std::string& what) {
  throw Error(path, path + (id.empty() ? "" : ": case '" + id + "'") + ": " + what);
}

bool is_tensor(const json& v) { return v.is_object() && v.contains("shape") && v.contains("dtype"); }

TensorSpec parse_tensor(const std::string& name, const json& v, const std::string& path, const std::string& id) {
  TensorSpec t;
  t.name = name;
  const json& shape = v.at("shape");
  if (!shape.is_array() || shape.size() > 8)
    fail(path, id, "'" + name + "'.shape must be a list of at most 8 dims");
  int64_t n = 1;
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail(path, id, "'" + name + "'.shape must hold integers >= 0, got " + shape.dump());
    if (d.get<int64_t>() > 0 && __builtin_mul_overflow(n, d.get<int64_t>(), &n))
      fail(path, id, "'" + name + "'.shape " + shape.dump() + " has more than 2^63 elements");
    t.shape.push_back(d.get<int64_t>());
  }
  if (!v.at("dtype").is_string()) fail(path, id, "'" + name + "'.dtype must be a string");
  try {
    t.dtype = parse_dtype(v.at("dtype").get<std::string>(), "dtype");
  } catch (const Error& e) {
    fail(path, id, "'" + name + "': " + e.what());
  }
  return t;
}

double number(const json& c, const char* key, const std::string& path, const std::string& id) {
  if (!c.contains(key)) fail(path, id, std::string("missing field '") + key + "'");
  if (!c.at(key).is_number()) fail(path, id, std::string("field '") + key + "' must be a number");
  return c.at(key).get<double>();
}

}  // namespace

double Case::number_param(std::string_view name, const std::string& file) const {
  const std::string key(name);
  if (!params.contains(key)) fail(file, id, "missing input '" + key + "'");
  const json& v = params.at(key);
  if (v.is_number()) return v.get<double>();
  if (v.is_object() && v.contains("value") && v.at("value").is_number()) return v.at("value").get<double>();
  fail(file, id, "input '" + key + "' must be a number or {\"value\": number}, got " + v.dump());
}

CaseFile parse_case_file(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("test_cases") || !j.at("test_cases").is_array())
    fail(path, "", "expected an object with a 'test_cases' list");
  CaseFile f;
  f.path = path;
  auto str = [&](const char* k) { return j.contains(k) && j.at(k).is_string() ? j.at(k).get<std::string>() : std::string(); };
  f.op_name = str("op_name");
  f.source = str("source");
  f.description = str("description");
  if (f.op_name.empty()) {
    std::string stem = path.substr(path.find_last_of('/') + 1);
    for (const char* suffix : {"_test_cases.json", "_cases.json", ".json"}) {
      const std::string s(suffix);
      if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0) {
        stem.resize(stem.size() - s.size());
        break;
      }
    }
    f.op_name = stem;
  }
  size_t index = 0;
  for (const json& c : j.at("test_cases")) {
    const std::string where = "#" + std::to_string(index++);
    if (!c.is_object()) fail(path, where, "a case must be an object");
    if (!c.contains("id") || !c.at("id").is_string()) fail(path, where, "missing field 'id' (a string)");
    Case k;
    k.id = c.at("id").get<std::string>();
    if (c.contains("description") && c.at("description").is_string()) k.description = c.at("description").get<std::string>();
    if (!c.contains("seed") || !c.at("seed").is_number_integer()) fail(path, k.id, "missing field 'seed' (an integer)");
    k.seed = c.at("seed").get<uint64_t>();
    if (!c.contains("input") || !c.at("input").is_object()) fail(path, k.id, "missing field 'input' (an object)");
    k.params = json::object();
    for (const auto& [name, v] : c.at("input").items()) {
      if (is_tensor(v)) k.inputs.push_back(parse_tensor(name, v, path, k.id));
      else k.params[name] = v;
    }
    if (!c.contains("output") || !c.at("output").is_object()) fail(path, k.id, "missing field 'output' (an object)");
    const json& out = c.at("output");
    if (is_tensor(out)) {
      k.outputs.push_back(parse_tensor("output", out, path, k.id));
    } else {
      k.output_params = json::object();
      for (const auto& [name, v] : out.items()) {
        if (is_tensor(v)) k.outputs.push_back(parse_tensor(name, v, path, k.id));
        else k.output_params[name] = v;
      }
    }
    k.rtol = number(c, "rtol", path, k.id);
    k.atol = number(c, "atol", path, k.id);
    if (k.rtol < 0 || k.atol < 0) fail(path, k.id, "rtol and atol must be >= 0");
    f.cases.push_back(std::move(k));
  }
  return f;
}

CaseFile load_case_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, path + ": cannot open the file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path, path + ": not valid JSON (" + e.what() + ")");
  }
  return parse_case_file(j, path);
}

}  // namespace opgym::cases

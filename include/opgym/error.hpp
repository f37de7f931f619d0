// The one exception type of the core. Every message names the argument and what was expected,
// and is thrown before anything is written.
#pragma once
#include <stdexcept>
#include <string>

namespace opgym {

class Error : public std::invalid_argument {
 public:
  Error(std::string argument, const std::string& message)
      : std::invalid_argument(message), argument_(std::move(argument)) {}
  // The argument at fault ("x", "weight", "out", "eps", a case file's path, ...).
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace opgym

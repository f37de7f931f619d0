#pragma once
namespace opgym {
constexpr const char* kVersion = "0.1.0";
}

#pragma once
// Data types the cost model distinguishes (each has its own peak FLOP/s).

#include <optional>
#include <string_view>

namespace zion::sim {

enum class DType { kFp32 = 0, kTf32, kBf16, kFp16, kInt8 };
inline constexpr int kNumDTypes = 5;
inline constexpr const char* kDTypeNames[kNumDTypes] = {"fp32", "tf32", "bf16", "fp16", "int8"};

inline const char* dtype_name(DType d) { return kDTypeNames[static_cast<int>(d)]; }

inline std::optional<DType> parse_dtype(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == kDTypeNames[i]) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace zion::sim

#pragma once
// Units used everywhere inside the hardware model.
//
// Time is double seconds throughout csrc/sim. Bandwidth is bytes per second.
// Preset files speak GB/s (GB = 10^9 bytes), Gbit/s and nanoseconds; the
// loader converts once, at the boundary.

#include <cstdint>

namespace zion::sim {

using Seconds = double;
using BytesPerSecond = double;

inline constexpr double kNsPerSecond = 1e9;
inline constexpr double kGB = 1e9;          // decimal gigabyte, as vendors quote link speeds
inline constexpr double kGiB = 1073741824;  // 2^30, as nccl-tests sizes and ASTRA-sim bandwidths use

inline constexpr Seconds from_ns(double ns) { return ns / kNsPerSecond; }
inline constexpr double to_ns(Seconds s) { return s * kNsPerSecond; }

}  // namespace zion::sim

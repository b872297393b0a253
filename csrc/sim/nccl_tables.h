#pragma once
// NCCL v2.21.5's figures that both its tuner (nccl_tuning.cpp) and the pipeline
// model of its kernels (nccl_launch.cpp) use: src/graph/tuning.cc. Indices:
// algorithm Tree, Ring, NVLS, NVLSTree; protocol LL, LL128, Simple. Microseconds and GB/s.
// Included by those two files only.

#include "nccl_tuning.h"

namespace zion::sim::nccl_tables {

// baseLat: Tree {6.8, 14.0, 0}, Ring {6.6, 14.0, 8.4}, NVLS {0, 0, 0}, NVLSTree {0, 0, 0}.
inline constexpr double kBaseLatency[kNcclAlgorithms][kNcclProtocols] = {
    {6.8, 14.0, 0}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}};
// hwLat[NVLINK]: Tree {.6, 1.25, 28}, Ring {.6, 1.9, 3.4}, NVLS {0, 0, 25}, NVLSTree {0, 0, 25}.
inline constexpr double kNvlinkLatency[kNcclAlgorithms][kNcclProtocols] = {
    {0.6, 1.25, 28}, {0.6, 1.9, 3.4}, {0, 0, 25}, {0, 0, 25}};

// Per GPU generation (Volta, Ampere, Hopper), one node (the N1 column):
inline constexpr double kLLMaxBw[3] = {39.0, 87.7, 141.0};            // llMaxBws[gen][0]
inline constexpr double kPerChMaxRingLL128Bw[3] = {20.0, 20.0, 36.7};  // perChMaxRingLL128Bws[gen][0]

// Index of the per-generation columns: Volta, Ampere, Hopper.
inline int generation_index(int cc) { return cc >= 90 ? 2 : cc >= 80 ? 1 : 0; }

}  // namespace zion::sim::nccl_tables

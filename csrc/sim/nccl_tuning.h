#pragma once
// NCCL's own performance model of its collectives, as its tuner uses it to
// pick an algorithm and a protocol per call (NCCL v2.21.5,
// src/graph/tuning.cc ncclTopoTuneModel / ncclTopoGetAlgoTime, and the
// channel search of src/graph/search.cc ncclTopoCompute), for the GPUs of one
// node on an NVSwitch:
//
//   time(algorithm, protocol) = latency + bytes / bandwidth
//
// latency: a base latency per (algorithm, protocol) plus a per-step NVLink
// latency times the algorithm's steps; bandwidth: channels x per-channel
// bandwidth from the channel search, times per-protocol factors and caps per
// GPU generation (LL halves it and caps it at llMaxBw, LL128 takes 0.92 of it
// up to a per-channel cap, trees 0.92 up to a per-channel cap, with an LL
// factor 1/3.8 and LL128 7/9), converted to algorithm bandwidth (ring
// ranks/steps, tree 1/2, NVLS 5/6); trees' bandwidth is further scaled by a
// correction factor per power-of-two size. The (algorithm, protocol) of least
// time is chosen, ties going to the first in NCCL's order (Tree, Ring, NVLS;
// LL, LL128, Simple).
//
// Sizes are NCCL's nBytes, which are the nccl-tests sizes: the buffer of
// all_reduce, broadcast and reduce, the gathered output of all_gather and the
// input of reduce_scatter.

#include <array>
#include <string>
#include <vector>

#include "collective.h"
#include "units.h"

namespace zion::sim {

enum class NcclAlgorithm { kTree = 0, kRing, kNvls };
enum class NcclProtocol { kLL = 0, kLL128, kSimple };
inline constexpr int kNcclAlgorithms = 3;
inline constexpr int kNcclProtocols = 3;
const char* nccl_algorithm_name(NcclAlgorithm a);  // "Tree", "Ring", "NVLS" (NCCL's spelling)
const char* nccl_protocol_name(NcclProtocol p);    // "LL", "LL128", "Simple"
// The model's algorithm under the CollectiveModel's names: ring,
// double_binary_tree, in_switch.
Algorithm model_algorithm(NcclAlgorithm a);

// One channel graph of NCCL's search: channels of `bandwidth` GB/s each.
struct NcclGraph {
  int channels = 0;
  double bandwidth = 0;  // GB/s per channel (NVLS: min(bwIntra, bwInter))
};

struct NcclTuningInput {
  int compute_capability = 80;  // 70 Volta, 80 Ampere, 90 Hopper
  int ranks = 8;                // GPUs of the communicator, all in one node
  double nvlink_gb_per_s = 0;   // each GPU's NVLink bandwidth into the NVSwitch, NCCL's figure (links x per-link)
  bool nvls = false;            // NVLink SHARP available (NCCL needs compute capability >= 90 too)
};

struct NcclChoice {
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  Seconds time = 0;
  Seconds latency = 0;
  double bandwidth = 0;  // algorithm bandwidth, bytes/s, after the tree correction factor
};

class NcclTuning {
 public:
  // Throws std::invalid_argument naming a field that is out of range.
  explicit NcclTuning(const NcclTuningInput& input);

  const NcclTuningInput& input() const { return input_; }
  const NcclGraph& graph(NcclAlgorithm a) const { return graphs_[static_cast<int>(a)]; }
  // NCCL's table: microseconds and GB/s of algorithm bandwidth; 0 bandwidth
  // where NCCL does not offer the pair for the collective.
  double latency_us(CollectiveOp op, NcclAlgorithm a, NcclProtocol p) const;
  double bandwidth_gb_per_s(CollectiveOp op, NcclAlgorithm a, NcclProtocol p) const;
  // Whether NCCL's tuning model prices `op` (all_to_all and send/recv are
  // point-to-point in NCCL: no tuner).
  static bool covers(CollectiveOp op);

  // Every pair NCCL offers for op at this size, in NCCL's order.
  std::vector<NcclChoice> candidates(CollectiveOp op, double bytes) const;
  // The fastest pair; `only` restricts it to one algorithm (nullptr: all).
  // Throws std::invalid_argument if no pair is offered.
  NcclChoice choose(CollectiveOp op, double bytes, const NcclAlgorithm* only = nullptr) const;

 private:
  static int op_index(CollectiveOp op);
  NcclTuningInput input_;
  std::array<NcclGraph, kNcclAlgorithms> graphs_{};
  // [op][algorithm][protocol], op indexed by op_index (broadcast, reduce,
  // all_gather, reduce_scatter, all_reduce).
  double latency_[5][kNcclAlgorithms][kNcclProtocols] = {};
  double bandwidth_[5][kNcclAlgorithms][kNcclProtocols] = {};
};

}  // namespace zion::sim

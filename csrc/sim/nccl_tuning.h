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
// time is chosen, ties going to the first in NCCL's order (Tree, Ring, NVLS,
// NVLSTree; LL, LL128, Simple).
//
// Sizes are NCCL's nBytes, which are the nccl-tests sizes: the buffer of
// all_reduce, broadcast and reduce, the gathered output of all_gather and the
// input of reduce_scatter.
//
// Two time models (collectives.nccl_tuner.time_model). "tuner" prices the
// chosen pair by the tuner's own latency + bytes / bandwidth. "pipeline"
// keeps the tuner's choice and times it the way NCCL's ring kernels run it
// (launch(): src/enqueue.cc, src/device/all_reduce.h, all_gather.h,
// reduce_scatter.h, broadcast.h, reduce.h, prims_simple.h): the channels
// launched, the bytes of the busiest channel, the protocol's chunk, the
// kernel's loops over the channel's bytes, and per loop the ring's sends
// (2(n-1) for all_reduce, n-1 for all_gather / reduce_scatter, a chain of n-1
// hops for broadcast / reduce), Simple's slices (LL / LL128: lines) taking
// bytes / channel bandwidth and reaching the next rank a hop later; NVLS
// as a pipeline of loops through warp groups. Tree keeps the tuner's time.
//
// More than one node (nodes > 1, the same GPUs on each): the channel search
// of ncclTopoCompute with NICs (speedArrayInter / sm90SpeedArrayInter, each
// channel entering a node at one NIC and leaving it at the same NIC, the
// search's per-channel speed capped by the GPU-to-NIC path), ring and
// balanced tree graphs with bwIntra / bwInter; ncclTopoTuneModel's
// bandwidths (bwIntra up to 2 nodes, bwInter beyond; the N2 / N4 columns of
// the per-channel caps; llMaxBw by CPU vendor; tree LL128 x 120/128) and
// latencies (hwLat[NET], the NIC's post overhead, ring inter-node steps,
// tree log2(nodes) inter-node hops); and
// ncclTopoGetAlgoTime's ring plateau (Simple all_reduce latency x 1.4, x 1.9
// before Ampere). With NVLink SHARP (nvls, compute capability >= 90, more
// than 2 GPUs per node) the NVLS graph is searched with NICs too (one channel
// per NIC, headed by the GPU local to it, bwInter raised alone in pass 2),
// and all_reduce gets NVLSTree / Simple (src/graph/tuning.cc: per channel
// min(bwIntra, bwInter, or bwInter / 2 beyond 2 nodes), x 5/6; latency
// hwLat[NVLINK] + 2 log2(nodes) hwLat[NET]; src/enqueue.cc topoGetAlgoInfo
// offers it where NVLS is supported, src/graph/tuning.cc only with
// nNodes > 1). NVLS itself stays off across nodes (NCCL needs CollNet for it
// there); CollNet is not modeled. Both time models charge the tuner's own
// time across nodes.

#include <array>
#include <string>
#include <vector>

#include "collective.h"
#include "units.h"

namespace zion::sim {

// NCCL's algorithms in its order (src/include/device.h NCCL_ALGO_*, less the
// two CollNet ones, which are not modeled): ties go to the first.
enum class NcclAlgorithm { kTree = 0, kRing, kNvls, kNvlsTree };
enum class NcclProtocol { kLL = 0, kLL128, kSimple };
inline constexpr int kNcclAlgorithms = 4;
inline constexpr int kNcclProtocols = 3;
const char* nccl_algorithm_name(NcclAlgorithm a);  // "Tree", "Ring", "NVLS", "NVLSTree" (NCCL's ncclAlgoStr)
const char* nccl_protocol_name(NcclProtocol p);    // "LL", "LL128", "Simple"
std::vector<std::string> nccl_algorithm_names();  // in NcclAlgorithm's order
// NCCL's spelling to the enum; throws std::invalid_argument naming the allowed.
NcclAlgorithm parse_nccl_algorithm(const std::string& name);
// The model's algorithm under the CollectiveModel's names: ring,
// double_binary_tree, in_switch, and hierarchical for NVLSTree (a reduce-
// scatter through the node's NVSwitch, a tree across nodes, an all-gather
// through the NVSwitch: the two levels of the model's hierarchical).
Algorithm model_algorithm(NcclAlgorithm a);

// One channel graph of NCCL's search: channels of `bandwidth` GB/s each.
// NVLS and NVLSTree share one graph, as in NCCL (src/init.cc graphs[]).
struct NcclGraph {
  int channels = 0;
  double bandwidth = 0;  // GB/s per channel (NVLS: min(bwIntra, bwInter)); across nodes bwIntra
  double inter_bandwidth = 0;  // bwInter, GB/s per channel through the NICs (nodes > 1 only; 0 on one node)
};

struct NcclTuningInput {
  int compute_capability = 80;  // 70 Volta, 80 Ampere, 90 Hopper
  int ranks = 8;                // GPUs of the communicator (all nodes)
  double nvlink_gb_per_s = 0;   // each GPU's NVLink bandwidth into the NVSwitch, NCCL's figure (links x per-link)
  bool nvls = false;            // NVLink SHARP available (NCCL needs compute capability >= 90 too)
  // Across nodes (nodes > 1): ranks / nodes GPUs on each node, at least 2.
  int nodes = 1;
  // NICs of a node the channels can use: each shares a PCIe switch with two
  // or more of the node's GPUs (a channel enters at one of them and leaves
  // from another), at most one per such GPU.
  int nics = 0;
  // GB/s of one NIC as NCCL's search sees it: the GPU-to-NIC path, min(NIC
  // speed / 8, the PCIe links' width x per-lane figure).
  double nic_gb_per_s = 0;
  bool amd_cpu = false;  // the host CPU's vendor is AMD (llMaxBws row, getNetOverhead 2 us instead of 1)
};

// collectives.nccl_tuner.time_model: "tuner" or "pipeline".
enum class NcclTimeModel { kTuner = 0, kPipeline };

struct NcclChoice {
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  Seconds time = 0;
  Seconds latency = 0;
  double bandwidth = 0;  // algorithm bandwidth, bytes/s, after the tree correction factor
};

// How NCCL v2.21.5 runs one call of a ring (algorithm, protocol), and the
// time that takes on the busiest channel (the channels run in parallel).
struct NcclLaunch {
  bool modeled = false;        // false: Tree, or any pair across nodes (NVLSTree too), timed by the tuner in both models
  int collective_channels = 0; // the communicator's (ncclTopoPostset: 2 x min(ring, tree) search channels, <= 32)
  int channels = 0;            // launched (enqueue.cc getChannnelThreadInfo, then addTunedCollToPlan)
  int threads = 0;             // per channel
  double channel_bytes = 0;    // bytes of the busiest channel (all_gather / reduce_scatter: of each rank's piece)
  double chunk_bytes = 0;      // the protocol's chunk of data (computeCollChunkInfo)
  long long loops = 0;         // iterations of the kernel's loop over the channel's bytes
  double last_chunk_bytes = 0; // the chunk of the last loop (all_reduce: lastChunkCount)
  int sends = 0;               // sends per loop (broadcast / reduce: chain hops; NVLS: stages)
  int slices = 1;              // slices per chunk (Simple: CHUNKSTEPS / SLICESTEPS)
  // bytes/s of one channel: the tuner's ring bus bandwidth for the launched channels, over those channels
  double channel_bandwidth = 0;
  Seconds hop_latency = 0;     // hwLat[NVLINK][Ring][protocol]
  Seconds base_latency = 0;    // baseLat[Ring][protocol]
  Seconds time = 0;            // base latency + the busiest channel's loops
};

class NcclTuning {
 public:
  // Throws std::invalid_argument naming a field that is out of range.
  explicit NcclTuning(const NcclTuningInput& input);

  const NcclTuningInput& input() const { return input_; }
  const NcclGraph& graph(NcclAlgorithm a) const { return graphs_[static_cast<int>(a)]; }
  // NCCL's table: microseconds and GB/s of algorithm bandwidth; 0 bandwidth
  // where NCCL does not offer the pair for the collective. The latency is
  // before ncclTopoGetAlgoTime's ring plateau factor (candidates applies it).
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
  // The pipeline model of one call (see above); Tree, and every pair across
  // nodes, comes back with modeled = false and the tuner's time.
  NcclLaunch launch(CollectiveOp op, double bytes, NcclAlgorithm a, NcclProtocol p) const;
  // The chosen pair's time under `model`.
  Seconds time(CollectiveOp op, double bytes, const NcclChoice& choice, NcclTimeModel model) const;
  int collective_channels() const;

 private:
  static int op_index(CollectiveOp op);
  void tune_across_nodes();  // nodes > 1: the graphs and tables (nccl_tuning.cpp)
  NcclTuningInput input_;
  std::array<NcclGraph, kNcclAlgorithms> graphs_{};
  // [op][algorithm][protocol], op indexed by op_index (broadcast, reduce,
  // all_gather, reduce_scatter, all_reduce).
  double latency_[5][kNcclAlgorithms][kNcclProtocols] = {};
  double bandwidth_[5][kNcclAlgorithms][kNcclProtocols] = {};
};

}  // namespace zion::sim

#pragma once
// Timed collectives: how long an all-reduce, all-to-all, ... of a given size
// takes among given devices, by a given algorithm, under a given link model.
//
// Sizes follow nccl-tests: `bytes` is the per-rank buffer of all_reduce,
// broadcast and reduce, the per-rank input of reduce_scatter and all_to_all,
// and the per-rank output of all_gather. Results carry algbw = bytes / time
// and busbw = algbw x the nccl-tests factor of the operation.

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "link_model.h"
#include "names.h"
#include "platform.h"
#include "topology.h"

namespace zion::sim {

enum class CollectiveOp { kAllReduce, kReduceScatter, kAllGather, kAllToAll, kBroadcast, kReduce, kSendRecv };
inline constexpr std::array<Named<CollectiveOp>, 7> kCollectiveOps{{
    {CollectiveOp::kAllReduce, "all_reduce"},
    {CollectiveOp::kReduceScatter, "reduce_scatter"},
    {CollectiveOp::kAllGather, "all_gather"},
    {CollectiveOp::kAllToAll, "all_to_all"},
    {CollectiveOp::kBroadcast, "broadcast"},
    {CollectiveOp::kReduce, "reduce"},
    {CollectiveOp::kSendRecv, "send_recv"},
}};

enum class Algorithm { kAuto, kRing, kDirect, kHalvingDoubling, kDoubleBinaryTree, kHierarchical, kInSwitch };
// kAuto first: the concrete algorithms are the rest of the table.
inline constexpr std::array<Named<Algorithm>, 7> kAlgorithms{{
    {Algorithm::kAuto, "auto"},
    {Algorithm::kRing, "ring"},
    {Algorithm::kDirect, "direct"},
    {Algorithm::kHalvingDoubling, "halving_doubling"},
    {Algorithm::kDoubleBinaryTree, "double_binary_tree"},
    {Algorithm::kHierarchical, "hierarchical"},
    {Algorithm::kInSwitch, "in_switch"},
}};

const char* collective_op_name(CollectiveOp op);
CollectiveOp parse_collective_op(const std::string& name);  // throws std::invalid_argument naming the allowed
std::vector<std::string> collective_op_names();
const char* algorithm_name(Algorithm a);
Algorithm parse_algorithm(const std::string& name);  // throws std::invalid_argument naming the allowed
std::vector<std::string> algorithm_names();           // "auto" first
const std::vector<Algorithm>& concrete_algorithms();  // every algorithm but kAuto

// nccl-tests bus-bandwidth factor: all_reduce 2(n-1)/n; reduce_scatter,
// all_gather, all_to_all (n-1)/n; broadcast, reduce, send/recv 1.
double bus_bandwidth_factor(CollectiveOp op, int ranks);

struct CollectiveRequest {
  CollectiveOp op = CollectiveOp::kAllReduce;
  double bytes = 0;
  std::vector<int> devices;  // global device ids; for send/recv: {sender, receiver}
  Algorithm algorithm = Algorithm::kAuto;
  LinkModel link_model = LinkModel::kFair;
  int root = 0;  // index into `devices`, for broadcast and reduce
  // all_to_all with uneven sizes: matrix[i][j] = bytes devices[i] sends to
  // devices[j]. Empty: every pair gets bytes / n.
  std::vector<std::vector<double>> all_to_all_bytes;
  // Always simulate step by step, even where a closed form applies (tests
  // compare the two).
  bool force_simulation = false;
};

struct CollectiveResult {
  Seconds time = 0;
  double algbw = 0;  // bytes per second
  double busbw = 0;
  Algorithm algorithm = Algorithm::kAuto;
  bool closed_form = false;
  int transfers = 0;  // transfers simulated (0 on the closed-form path)
  // Set when NCCL's tuning model priced the call (nccl_tuning.h): its
  // protocol ("LL", "LL128", "Simple"); empty otherwise.
  std::string protocol;
};

class NcclTuning;

// How collectives are run on a topology, besides the topology itself.
struct CollectiveSettings {
  Seconds base_latency = 0;
  int pipeline_chunks = 1;
  AstraSpec astra;
  BytesPerSecond local_memory_bandwidth = 0;  // for ASTRA's reduction cost
  double in_switch_efficiency = 1.0;
  bool in_switch_reduction = false;
  // Rings within a node run over the link-disjoint rings of direct links
  // (link_disjoint_rings), not one ring in rank order: a hybrid cube mesh,
  // whose rank order is not a ring of direct links.
  bool link_disjoint_rings = false;
  Seconds in_switch_latency = 0;
  Algorithm default_algorithm = Algorithm::kAuto;
  // The algorithms `auto` chooses among (empty: all of them).
  std::vector<Algorithm> auto_algorithms;
  // Per hierarchy level (innermost first): the algorithm used inside that
  // level by kHierarchical (kAuto: the fastest).
  std::vector<Algorithm> level_algorithms;
  // NCCL's tuning model for `auto` (0: off): the GPUs'
  // compute capability, each GPU's NVLink bandwidth into the switch (GB/s,
  // NCCL's figure) and whether NVLink SHARP reduces in the switch.
  int nccl_compute_capability = 0;
  double nccl_nvlink_gb_per_s = 0;
  bool nccl_nvls = false;
  // Time the tuner's choice by NCCL's ring pipeline (collectives.nccl_tuner.time_model = "pipeline").
  bool nccl_pipeline = false;
  // Across nodes (nccl_tuning.h): per PCIe switch of a node, the GPUs (local
  // indices) and the GB/s of each NIC's GPU-to-NIC path (min(NIC, PCIe
  // links)); the host CPU's vendor (collectives.nccl_tuner.cpu_vendor); and
  // whether the NICs reach GPU memory directly (GPUDirect RDMA; without it
  // the tuner is not used across nodes).
  struct NcclPcieSwitch {
    std::vector<int> gpus;
    std::vector<double> nic_gb_per_s;
  };
  std::vector<NcclPcieSwitch> nccl_pcie_switches;
  bool nccl_amd_cpu = false;
  bool nccl_gpudirect = false;
};

class CollectiveModel {
 public:
  // A platform: devices are its OAMs, node-major; level 0 is the node's
  // accelerator fabric, level 1 the scale-out network.
  explicit CollectiveModel(const Platform& platform);
  // A topology of NPUs with `level_sizes` (mixed radix, innermost first), as
  // ASTRA-sim's multi-dimensional networks; device i is vertex i.
  CollectiveModel(std::shared_ptr<const Topology> topology, std::vector<int> level_sizes, CollectiveSettings settings);

  CollectiveResult run(const CollectiveRequest& request) const;
  Seconds time(const CollectiveRequest& request) const { return run(request).time; }
  // The traffic of the request run by `algorithm` (a concrete one, e.g. the
  // one run() chose): bytes summed over every link each flow crosses,
  // indexed by the topology's link class. Flows split evenly over
  // equal-cost paths. Plans are linear in size, so each rank set's traffic
  // is planned once and scaled.
  std::vector<double> link_class_bytes(const CollectiveRequest& request, Algorithm algorithm) const;

  const Topology& topology() const { return *topology_; }
  std::shared_ptr<const Topology> shared_topology() const { return topology_; }
  const CollectiveSettings& settings() const { return settings_; }
  int device_count() const { return static_cast<int>(device_vertex_.size()); }
  int device_vertex(int device) const;
  // The rings the ring algorithm runs at once among `devices`, each a
  // device order splitting the data evenly with the others: the given order
  // alone, or on a hybrid cube mesh the link-disjoint rings of direct links.
  std::vector<std::vector<int>> rings(const std::vector<int>& devices) const;
  // The same for vertices; empty when the ring runs in the given order.
  std::vector<std::vector<int>> vertex_rings(const std::vector<int>& vertices) const;

  struct Internals;  // per-request timing (collective_timing.cpp)
  struct Template;   // a plan's time as a function of size, per rank set
  struct Layout;     // how a rank set splits into hierarchy levels

 private:
  CollectiveResult compute(const CollectiveRequest& request) const;
  // NCCL's tuner prices `auto` for this request (one node, an op it covers,
  // the fair link model); its model for that many ranks.
  std::shared_ptr<const NcclTuning> nccl_tuning_for(const CollectiveRequest& request) const;
  void validate(const CollectiveRequest& request) const;

  std::shared_ptr<const Topology> topology_;
  CollectiveSettings settings_;
  std::vector<int> device_vertex_;
  std::vector<std::vector<int>> device_coords_;  // [device][level]
  std::vector<int> level_sizes_;
  std::vector<int> fabric_switch_of_node_;  // -1 where the fabric has no switch
  int devices_per_node_ = 0;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, CollectiveResult> cache_;
  mutable std::unordered_map<std::string, std::shared_ptr<const Template>> templates_;
  mutable std::unordered_map<std::string, std::shared_ptr<const Layout>> layouts_;
  mutable std::unordered_map<std::string, std::vector<double>> traffic_per_byte_;
  // By (ranks, nodes, usable NICs, GB/s per NIC).
  mutable std::map<std::tuple<int, int, int, double>, std::shared_ptr<const NcclTuning>> nccl_tunings_;
};

}  // namespace zion::sim

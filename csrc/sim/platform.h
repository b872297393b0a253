#pragma once
// The modeled machine, as read from a preset file (see platform_loader.h).
// Plain data in SI units: bytes, bytes per second, seconds, FLOP/s.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"
#include "names.h"
#include "units.h"

namespace zion::sim {

// Peak FLOP/s indexed by DType.
using PeakFlops = std::array<double, kNumDTypes>;

struct SocketSpec {
  int count = 0;
  int cores = 0;
  int64_t ddr_bytes = 0;
  BytesPerSecond ddr_bandwidth = 0;
  double ddr_random_access_efficiency = 1.0;
  PeakFlops peak_flops{};
};

struct UpiSpec {
  BytesPerSecond link_bandwidth = 0;
  Seconds latency = 0;
  std::vector<std::pair<int, int>> links;  // one entry per physical link
};

// Fraction of peak an op class reaches; the op cost model divides by these.
struct EfficiencySpec {
  double matmul = 1.0;
  double convolution = 1.0;
  double elementwise = 1.0;
  double reduction = 1.0;
  double embedding_random_access = 1.0;
};

struct OamSpec {
  int count = 0;
  int64_t hbm_bytes = 0;
  BytesPerSecond hbm_bandwidth = 0;
  PeakFlops peak_flops{};
  Seconds launch_overhead = 0;
  EfficiencySpec efficiency;
};

struct PcieSwitchSpec {
  std::string generation;         // of the switch's downstream ports; key of lane_bandwidth_by_generation
  std::string uplink_generation;  // of the links to its sockets (the CPU's own PCIe generation)
  int uplink_lanes = 0;
  int oam_lanes = 0;
  int nic_lanes = 0;
  std::vector<int> sockets;
  std::vector<int> oams;
  std::vector<int> nics;
};

struct PcieSpec {
  std::vector<std::pair<std::string, BytesPerSecond>> lane_bandwidth_by_generation;
  Seconds latency = 0;  // per hop
  std::vector<PcieSwitchSpec> switches;

  BytesPerSecond lane_bandwidth(const std::string& generation) const;
};

// fabric.topology of a platform file.
enum class FabricTopology { kFullyConnected, kHybridCubeMesh, kRing, kSwitch };
inline constexpr std::array<Named<FabricTopology>, 4> kFabricTopologies{{
    {FabricTopology::kFullyConnected, "fully_connected"},
    {FabricTopology::kHybridCubeMesh, "hybrid_cube_mesh"},
    {FabricTopology::kRing, "ring"},
    {FabricTopology::kSwitch, "switch"},
}};
const char* fabric_topology_name(FabricTopology t);
FabricTopology parse_fabric_topology(const std::string& name);  // throws std::invalid_argument naming the allowed
std::vector<std::string> fabric_topology_names();

struct FabricSpec {
  FabricTopology topology = FabricTopology::kFullyConnected;
  int links_per_pair = 1;  // for kSwitch: links from each OAM to the switch
  BytesPerSecond link_bandwidth = 0;
  Seconds latency = 0;  // per hop
  bool in_switch_reduction = false;
  double in_switch_reduction_efficiency = 1.0;
  Seconds in_switch_latency = 0;  // fixed cost of one in-switch collective, besides base latency
};

struct NicSpec {
  int count = 0;  // per node
  BytesPerSecond bandwidth = 0;
  Seconds latency = 0;
  bool gpudirect = true;
};

struct FrontendNicSpec {
  int count = 0;
  BytesPerSecond bandwidth = 0;
  Seconds latency = 0;
  std::vector<int> sockets;  // socket each front-end NIC hangs off
};

struct AstraSpec {
  Seconds endpoint_delay = 0;
  int preferred_dataset_splits = 1;
  int active_chunks_per_dimension = 1;
};

// collectives.nccl_tuner: `auto` on an NVSwitch (within one node, or across
// nodes of the same GPUs with NICs) is priced by NCCL's own tuning model
// (nccl_tuning.h) for the GPUs' compute capability.
// Other fabric topologies keep the topology model (the tuner's channel search
// here is the NVSwitch one).
struct NcclTunerSpec {
  bool enabled = false;
  int compute_capability = 0;  // 70, 80 or 90
  // How the chosen (algorithm, protocol) is timed: "tuner" (the tuner's own
  // latency + bytes / bandwidth) or "pipeline" (NCCL's ring kernels' chunks,
  // loops and steps; nccl_tuning.h). Optional in the file: absent = "tuner".
  std::string time_model = "tuner";
  // The host CPU's vendor, "intel", "amd" or "other": across nodes NCCL
  // picks llMaxBw and the NIC's post overhead by it. Optional: absent = "intel".
  std::string cpu_vendor = "intel";
};

struct CollectiveSpec {
  std::string algorithm = "auto";
  std::vector<std::string> algorithms;  // what `auto` may choose from (the collective library's menu)
  Seconds base_latency = 0;
  int pipeline_chunks = 1;
  AstraSpec astra;
  NcclTunerSpec nccl_tuner;  // optional in the file: absent = disabled
};

struct Platform {
  std::string name;
  std::string description;
  int nodes = 1;
  SocketSpec socket;
  UpiSpec upi;
  OamSpec oam;
  PcieSpec pcie;
  FabricSpec fabric;
  NicSpec nic;
  FrontendNicSpec frontend_nic;
  Seconds tor_latency = 0;
  CollectiveSpec collectives;
  // The merged JSON the platform was built from, serialized, so that callers
  // (Python, reports) can show every field exactly as given.
  std::string json;

  int devices_per_node() const { return oam.count; }
  int total_devices() const { return nodes * oam.count; }
};

}  // namespace zion::sim

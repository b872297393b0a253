#include "platform.h"

#include <stdexcept>

namespace zion::sim {

BytesPerSecond PcieSpec::lane_bandwidth(const std::string& generation) const {
  for (const auto& [name, bw] : lane_bandwidth_by_generation) {
    if (name == generation) return bw;
  }
  throw std::invalid_argument("unknown PCIe generation '" + generation + "'");
}

const char* fabric_topology_name(FabricTopology t) {
  switch (t) {
    case FabricTopology::kFullyConnected: return "fully_connected";
    case FabricTopology::kHybridCubeMesh: return "hybrid_cube_mesh";
    case FabricTopology::kRing: return "ring";
    case FabricTopology::kSwitch: return "switch";
  }
  return "?";
}

}  // namespace zion::sim

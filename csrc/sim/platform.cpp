#include "platform.h"

#include <stdexcept>

namespace zion::sim {

BytesPerSecond PcieSpec::lane_bandwidth(const std::string& generation) const {
  for (const auto& [name, bw] : lane_bandwidth_by_generation) {
    if (name == generation) return bw;
  }
  throw std::invalid_argument("unknown PCIe generation '" + generation + "'");
}

const char* fabric_topology_name(FabricTopology t) { return name_of(kFabricTopologies, t); }

FabricTopology parse_fabric_topology(const std::string& name) {
  return parse_name(kFabricTopologies, name, "fabric topology");
}

std::vector<std::string> fabric_topology_names() { return names_of(kFabricTopologies); }

}  // namespace zion::sim

#pragma once
// Builds the topology graph of a Platform, and composes ASTRA-sim style
// topologies from named blocks (Ring, FullyConnected, Switch per dimension).

#include <array>
#include <string>
#include <vector>

#include "names.h"
#include "platform.h"
#include "topology.h"

namespace zion::sim {

// Vertices per node, in this order: sockets, OAMs, PCIe switches, NICs,
// front-end NICs, the fabric switch (if the fabric is a switch); then the
// shared top-of-rack switch and the front-end network (reader hosts).
//
// Link classes: "upi", "pcie_<gen>_x<lanes>", "fabric", "nic",
// "frontend_nic". Parallel physical links between the same two vertices are
// one link with their summed bandwidth.
Topology build_topology(const Platform& platform);

// The vertex of global device `device` (node-major, OAM-minor).
int device_vertex(const Topology& topology, const Platform& platform, int device);

// The blocks of an ASTRA-sim network's `topology` list, by ASTRA-sim's names.
enum class DimensionKind { kRing, kFullyConnected, kSwitch };
inline constexpr std::array<Named<DimensionKind>, 3> kDimensionKinds{{
    {DimensionKind::kRing, "Ring"},
    {DimensionKind::kFullyConnected, "FullyConnected"},
    {DimensionKind::kSwitch, "Switch"},
}};
const char* dimension_kind_name(DimensionKind kind);
DimensionKind parse_dimension_kind(const std::string& name);  // throws std::invalid_argument naming the allowed
std::vector<std::string> dimension_kind_names();

// One dimension of an ASTRA-sim network: `npus` NPUs joined as a ring, fully
// connected or through a switch, every link `bandwidth` bytes/s and `latency`.
struct DimensionBlock {
  DimensionKind kind;
  int npus;
  BytesPerSecond bandwidth;
  Seconds latency;
};

// NPU ids are mixed-radix over the dimensions, dimension 0 fastest; vertex i
// is NPU i.
Topology build_dimension_topology(const std::vector<DimensionBlock>& dims);

}  // namespace zion::sim

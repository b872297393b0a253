#include "platform_topology.h"

#include <map>
#include <stdexcept>

namespace zion::sim {
namespace {

std::string indexed(const char* prefix, int node, int i, int nodes) {
  std::string name = prefix + std::to_string(i);
  return nodes > 1 ? "n" + std::to_string(node) + "." + name : name;
}

// Accelerator-fabric neighbours of OAM i.
std::vector<int> fabric_peers(FabricTopology topology, int i, int count) {
  std::vector<int> peers;
  switch (topology) {
    case FabricTopology::kFullyConnected:
      for (int j = 0; j < count; ++j) {
        if (j != i) peers.push_back(j);
      }
      break;
    case FabricTopology::kRing:
      peers.push_back((i + 1) % count);
      if (count > 2) peers.push_back((i + count - 1) % count);
      break;
    case FabricTopology::kHybridCubeMesh: {
      // Two fully connected quads, 0-3 and 4-7, plus i <-> i+4 (DGX-1 style).
      int quad = i / 4 * 4;
      for (int j = quad; j < quad + 4; ++j) {
        if (j != i) peers.push_back(j);
      }
      peers.push_back((i + 4) % 8);
      break;
    }
    case FabricTopology::kSwitch:
      break;
  }
  return peers;
}

void build_node(Topology& t, const Platform& p, int node, int tor, int frontend_net) {
  const int nodes = p.nodes;
  std::vector<int> sockets, oams, switches, nics, fnics;
  for (int i = 0; i < p.socket.count; ++i) sockets.push_back(t.add_vertex(VertexKind::kSocket, node, i, indexed("socket", node, i, nodes)));
  for (int i = 0; i < p.oam.count; ++i) oams.push_back(t.add_vertex(VertexKind::kOam, node, i, indexed("oam", node, i, nodes)));
  for (size_t i = 0; i < p.pcie.switches.size(); ++i) switches.push_back(t.add_vertex(VertexKind::kPcieSwitch, node, static_cast<int>(i), indexed("pcie", node, static_cast<int>(i), nodes)));
  for (int i = 0; i < p.nic.count; ++i) nics.push_back(t.add_vertex(VertexKind::kNic, node, i, indexed("nic", node, i, nodes)));
  for (int i = 0; i < p.frontend_nic.count; ++i) fnics.push_back(t.add_vertex(VertexKind::kFrontendNic, node, i, indexed("fnic", node, i, nodes)));
  int fabric_switch = -1;
  if (p.fabric.topology == FabricTopology::kSwitch) {
    fabric_switch = t.add_vertex(VertexKind::kFabricSwitch, node, 0, indexed("fabric_switch", node, 0, nodes));
  }

  // UPI: parallel links between a socket pair become one link of summed bandwidth.
  std::map<std::pair<int, int>, int> upi_count;
  for (auto [a, b] : p.upi.links) upi_count[{std::min(a, b), std::max(a, b)}]++;
  for (auto [pair, n] : upi_count) {
    int cls = t.add_link_class("upi", n * p.upi.link_bandwidth, p.upi.latency);
    t.add_duplex(sockets[pair.first], sockets[pair.second], cls);
  }

  for (size_t s = 0; s < p.pcie.switches.size(); ++s) {
    const PcieSwitchSpec& sw = p.pcie.switches[s];
    auto pcie_class = [&](const std::string& generation, int lanes) {
      return t.add_link_class("pcie_" + generation + "_x" + std::to_string(lanes),
                              lanes * p.pcie.lane_bandwidth(generation), p.pcie.latency);
    };
    for (int sock : sw.sockets) t.add_duplex(switches[s], sockets[sock], pcie_class(sw.uplink_generation, sw.uplink_lanes));
    for (int o : sw.oams) t.add_duplex(switches[s], oams[o], pcie_class(sw.generation, sw.oam_lanes));
    for (int n : sw.nics) t.add_duplex(switches[s], nics[n], pcie_class(sw.generation, sw.nic_lanes));
  }

  int fabric = t.add_link_class("fabric", p.fabric.links_per_pair * p.fabric.link_bandwidth, p.fabric.latency);
  for (int i = 0; i < p.oam.count; ++i) {
    if (fabric_switch >= 0) {
      t.add_duplex(oams[i], fabric_switch, fabric);
      continue;
    }
    for (int j : fabric_peers(p.fabric.topology, i, p.oam.count)) {
      if (j > i) t.add_duplex(oams[i], oams[j], fabric);
    }
  }

  // Each NIC <-> ToR link carries one NIC's latency and half the switch's, so
  // a node-to-node path (two such links) pays both NICs and the switch once.
  int nic_up = t.add_link_class("nic", p.nic.bandwidth, p.nic.latency + p.tor_latency / 2);
  for (int n : nics) t.add_duplex(n, tor, nic_up);
  int fnic = t.add_link_class("frontend_nic", p.frontend_nic.bandwidth, p.frontend_nic.latency);
  for (int i = 0; i < p.frontend_nic.count; ++i) {
    t.add_duplex(fnics[i], sockets[p.frontend_nic.sockets[i]], fnic);
    t.add_duplex(fnics[i], frontend_net, fnic);
  }
}

}  // namespace

Topology build_topology(const Platform& p) {
  Topology t;
  t.set_transit_rules({p.nic.gpudirect});
  // Shared vertices are added after the nodes so node n occupies a contiguous
  // range; their ids are known in advance.
  int per_node = p.socket.count + p.oam.count + static_cast<int>(p.pcie.switches.size()) + p.nic.count +
                 p.frontend_nic.count + (p.fabric.topology == FabricTopology::kSwitch ? 1 : 0);
  int tor = p.nodes * per_node;
  int frontend_net = tor + 1;
  size_t links_before = 0;
  int links_per_node = 0;
  for (int node = 0; node < p.nodes; ++node) {
    build_node(t, p, node, tor, frontend_net);
    int added = static_cast<int>(t.links().size() - links_before);
    if (node == 0) links_per_node = added;
    if (added != links_per_node) throw std::logic_error("nodes of one platform built unequal");
    links_before = t.links().size();
  }
  if (t.add_vertex(VertexKind::kTorSwitch, -1, 0, "tor") != tor ||
      t.add_vertex(VertexKind::kFrontendNetwork, -1, 0, "readers") != frontend_net) {
    throw std::logic_error("vertex layout of the platform topology is inconsistent");
  }
  t.set_node_layout(p.nodes, per_node, links_per_node);
  return t;
}

int device_vertex(const Topology& topology, const Platform& platform, int device) {
  if (device < 0 || device >= platform.total_devices()) {
    throw std::out_of_range("device " + std::to_string(device) + " is not on platform '" + platform.name + "', which has " +
                            std::to_string(platform.total_devices()) + " devices (" + std::to_string(platform.nodes) +
                            " nodes x " + std::to_string(platform.oam.count) + " OAMs)");
  }
  int node = device / platform.oam.count;
  int v = topology.find(VertexKind::kOam, node, device % platform.oam.count);
  if (v < 0) throw std::logic_error("platform topology lacks an OAM vertex");
  return v;
}

const char* dimension_kind_name(DimensionKind kind) { return name_of(kDimensionKinds, kind); }

DimensionKind parse_dimension_kind(const std::string& name) { return parse_name(kDimensionKinds, name, "topology block"); }

std::vector<std::string> dimension_kind_names() { return names_of(kDimensionKinds); }

Topology build_dimension_topology(const std::vector<DimensionBlock>& dims) {
  Topology t;
  int total = 1;
  for (const auto& d : dims) {
    if (d.npus < 2) throw std::invalid_argument("each dimension needs at least 2 NPUs");
    total *= d.npus;
  }
  for (int i = 0; i < total; ++i) t.add_vertex(VertexKind::kNpu, 0, i, "npu" + std::to_string(i));
  int stride = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    const DimensionBlock& d = dims[k];
    int cls = t.add_link_class("dim" + std::to_string(k) + "_" + dimension_kind_name(d.kind), d.bandwidth, d.latency);
    // Every group of NPUs that differ only in coordinate k.
    for (int base = 0; base < total; ++base) {
      if ((base / stride) % d.npus != 0) continue;
      auto npu = [&](int c) { return base + c * stride; };
      if (d.kind == DimensionKind::kRing) {
        for (int c = 0; c < d.npus; ++c) {
          int next = (c + 1) % d.npus;
          if (d.npus == 2 && c == 1) break;
          t.add_duplex(npu(c), npu(next), cls);
        }
      } else if (d.kind == DimensionKind::kFullyConnected) {
        for (int a = 0; a < d.npus; ++a) {
          for (int b = a + 1; b < d.npus; ++b) t.add_duplex(npu(a), npu(b), cls);
        }
      } else {  // kSwitch
        int sw = t.add_vertex(VertexKind::kDimensionSwitch, 0, base, "dim" + std::to_string(k) + "_switch" + std::to_string(base));
        // ASTRA-sim's analytical switch: one link each way per NPU; the
        // latency is charged per link, so a switch hop costs it twice.
        for (int c = 0; c < d.npus; ++c) t.add_duplex(npu(c), sw, cls);
      }
    }
    stride *= d.npus;
  }
  return t;
}

}  // namespace zion::sim

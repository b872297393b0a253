#pragma once
// A topology graph: vertices (sockets, OAMs, switches, NICs, NPUs) joined by
// directed links, each a bandwidth and a latency; and the routes between them.
//
// Routes are shortest paths under the weight latency + 1 MiB / bandwidth (the
// time a 1 MiB message takes on the link alone), computed once per vertex pair
// and cached. Link-disjoint paths of equal weight share a transfer evenly (as
// ECMP does), e.g. the two directions to the opposite node of a ring.
//
// Machines built of identical nodes declare that with `set_node_layout`: a
// route between nodes a and b is then computed once for nodes 0 and 0/1 and
// translated, so that a 128-node machine costs no more to route than two.

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "units.h"

namespace zion::sim {

enum class VertexKind { kSocket, kOam, kPcieSwitch, kNic, kFrontendNic, kFabricSwitch, kTorSwitch, kFrontendNetwork, kNpu, kDimensionSwitch };
const char* vertex_kind_name(VertexKind k);

struct Vertex {
  VertexKind kind;
  int node;   // -1 for vertices shared by all nodes (the top-of-rack switch)
  int index;  // index among vertices of its kind within the node
  std::string name;
};

struct LinkClass {
  std::string name;  // "upi", "pcie_gen4_x16", "fabric", "nic", ...
  BytesPerSecond bandwidth;
  Seconds latency;
};

struct Link {
  int src;
  int dst;
  BytesPerSecond bandwidth;
  Seconds latency;
  int link_class;
};

struct Path {
  std::vector<int> links;
  Seconds latency = 0;
  BytesPerSecond bottleneck = 0;
};

struct Route {
  std::vector<Path> paths;  // equal-cost, link-disjoint; a transfer splits evenly
  Seconds latency = 0;      // the longest path's
  BytesPerSecond bandwidth = 0;  // sum of the paths' bottlenecks
  int hops() const { return paths.empty() ? 0 : static_cast<int>(paths.front().links.size()); }
};

// Which vertices a route may pass through (rather than start or end at).
struct TransitRules {
  bool gpudirect = true;  // false: OAM <-> NIC traffic is staged through a socket
};

class Topology {
 public:
  int add_vertex(VertexKind kind, int node, int index, std::string name);
  int add_link_class(const std::string& name, BytesPerSecond bandwidth, Seconds latency);
  // Two directed links, one each way, both of class `link_class`.
  void add_duplex(int a, int b, int link_class);
  void set_transit_rules(TransitRules rules) { rules_ = rules; }
  // Vertices [n*V, (n+1)*V) and links [n*L, (n+1)*L) belong to node n for
  // n < nodes; later vertices and links are shared.
  void set_node_layout(int nodes, int vertices_per_node, int links_per_node);

  const std::vector<Vertex>& vertices() const { return vertices_; }
  const std::vector<Link>& links() const { return links_; }
  const std::vector<LinkClass>& link_classes() const { return classes_; }
  int find(VertexKind kind, int node, int index) const;  // -1 if absent
  // Whether a link runs from vertex a to vertex b (one hop, no transit).
  bool adjacent(int a, int b) const;

  // The route from vertex src to vertex dst (src != dst). Thread-safe.
  const Route& route(int src, int dst) const;

 private:
  Route compute_route(int src, int dst) const;
  bool may_transit(int in_link, int vertex, int out_link) const;
  int node_of(int vertex) const;
  int translate_link(int link, int from_node_a, int to_node_a, int from_node_b, int to_node_b) const;

  std::vector<Vertex> vertices_;
  std::vector<Link> links_;
  std::vector<LinkClass> classes_;
  std::vector<std::vector<int>> out_links_;
  TransitRules rules_;
  int nodes_ = 0, vertices_per_node_ = 0, links_per_node_ = 0;

  struct RouteCache {
    std::mutex mutex;
    std::unordered_map<int64_t, std::unique_ptr<Route>> routes;  // stable addresses
  };
  std::unique_ptr<RouteCache> cache_ = std::make_unique<RouteCache>();
};

}  // namespace zion::sim

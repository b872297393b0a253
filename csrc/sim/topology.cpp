#include "topology.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <stdexcept>

namespace zion::sim {
namespace {

// Weight of a link for route selection: the time a 1 MiB message takes on it
// alone. Latency decides among fast links, bandwidth among slow ones.
constexpr double kRouteReferenceBytes = 1 << 20;
constexpr int kMaxEqualCostPaths = 8;

double weight(const Link& l) { return l.latency + kRouteReferenceBytes / l.bandwidth; }

bool same_cost(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(a, b); }

}  // namespace

const char* vertex_kind_name(VertexKind k) {
  switch (k) {
    case VertexKind::kSocket: return "socket";
    case VertexKind::kOam: return "oam";
    case VertexKind::kPcieSwitch: return "pcie_switch";
    case VertexKind::kNic: return "nic";
    case VertexKind::kFrontendNic: return "frontend_nic";
    case VertexKind::kFabricSwitch: return "fabric_switch";
    case VertexKind::kTorSwitch: return "tor_switch";
    case VertexKind::kFrontendNetwork: return "frontend_network";
    case VertexKind::kNpu: return "npu";
    case VertexKind::kDimensionSwitch: return "dimension_switch";
  }
  return "?";
}

int Topology::add_vertex(VertexKind kind, int node, int index, std::string name) {
  vertices_.push_back({kind, node, index, std::move(name)});
  if (out_links_.size() < vertices_.size()) out_links_.resize(vertices_.size());
  return static_cast<int>(vertices_.size()) - 1;
}

int Topology::add_link_class(const std::string& name, BytesPerSecond bandwidth, Seconds latency) {
  for (size_t i = 0; i < classes_.size(); ++i) {
    if (classes_[i].name == name && classes_[i].bandwidth == bandwidth && classes_[i].latency == latency) {
      return static_cast<int>(i);
    }
  }
  if (!(bandwidth > 0)) throw std::invalid_argument("link class '" + name + "' needs a bandwidth > 0");
  classes_.push_back({name, bandwidth, latency});
  return static_cast<int>(classes_.size()) - 1;
}

void Topology::add_duplex(int a, int b, int link_class) {
  const LinkClass& c = classes_.at(link_class);
  for (auto [s, d] : {std::pair{a, b}, std::pair{b, a}}) {
    links_.push_back({s, d, c.bandwidth, c.latency, link_class});
    // A vertex may be linked before it is added (shared vertices come last).
    if (out_links_.size() <= static_cast<size_t>(s)) out_links_.resize(s + 1);
    out_links_[s].push_back(static_cast<int>(links_.size()) - 1);
  }
}

void Topology::set_node_layout(int nodes, int vertices_per_node, int links_per_node) {
  nodes_ = nodes;
  vertices_per_node_ = vertices_per_node;
  links_per_node_ = links_per_node;
}

int Topology::find(VertexKind kind, int node, int index) const {
  for (size_t v = 0; v < vertices_.size(); ++v) {
    const Vertex& x = vertices_[v];
    if (x.kind == kind && x.node == node && x.index == index) return static_cast<int>(v);
  }
  return -1;
}

bool Topology::adjacent(int a, int b) const {
  if (a < 0 || static_cast<size_t>(a) >= out_links_.size()) return false;
  for (int l : out_links_[a]) {
    if (links_[l].dst == b) return true;
  }
  return false;
}

int Topology::node_of(int vertex) const {
  if (vertices_per_node_ == 0 || vertex >= nodes_ * vertices_per_node_) return -1;
  return vertex / vertices_per_node_;
}

bool Topology::may_transit(int in_link, int vertex, int out_link) const {
  VertexKind from = vertices_[links_[in_link].src].kind;
  VertexKind to = vertices_[links_[out_link].dst].kind;
  auto fabric_end = [](VertexKind k) { return k == VertexKind::kOam || k == VertexKind::kFabricSwitch; };
  switch (vertices_[vertex].kind) {
    case VertexKind::kOam:
      // Accelerators forward fabric traffic only; they are not PCIe bridges.
      return fabric_end(from) && fabric_end(to);
    case VertexKind::kPcieSwitch:
      // Without GPUDirect RDMA, NIC <-> accelerator data is staged in host memory.
      if (!rules_.gpudirect && ((from == VertexKind::kOam && to == VertexKind::kNic) ||
                                (from == VertexKind::kNic && to == VertexKind::kOam))) {
        return false;
      }
      return true;
    case VertexKind::kFrontendNetwork:
      return false;  // reader hosts are an endpoint, not a path between trainers
    default:
      return true;
  }
}

Route Topology::compute_route(int src, int dst) const {
  int node_a = node_of(src), node_b = node_of(dst);
  // Traffic within one node never leaves it: shared vertices (the ToR) are
  // only for routes between nodes.
  bool one_node = node_a >= 0 && node_a == node_b;
  auto allowed_vertex = [&](int v) {
    int n = node_of(v);
    return n < 0 ? !one_node : (n == node_a || n == node_b);
  };
  std::vector<char> banned(links_.size(), 0);
  Route route;
  double best_cost = 0;
  for (int round = 0; round < kMaxEqualCostPaths; ++round) {
    // Dijkstra over links (states), so that transit rules can see how a
    // vertex was entered.
    std::vector<double> dist(links_.size(), std::numeric_limits<double>::infinity());
    std::vector<int> prev(links_.size(), -1);
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
    for (int l : out_links_[src]) {
      if (banned[l] || !allowed_vertex(links_[l].dst)) continue;
      dist[l] = weight(links_[l]);
      queue.push({dist[l], l});
    }
    int last = -1;
    while (!queue.empty()) {
      auto [d, l] = queue.top();
      queue.pop();
      if (d > dist[l]) continue;
      int v = links_[l].dst;
      if (v == dst) {
        last = l;
        break;
      }
      if (v == src) continue;
      for (int m : out_links_[v]) {
        if (banned[m] || !allowed_vertex(links_[m].dst) || !may_transit(l, v, m)) continue;
        double nd = d + weight(links_[m]);
        if (nd < dist[m]) {
          dist[m] = nd;
          prev[m] = l;
          queue.push({nd, m});
        }
      }
    }
    if (last < 0) break;
    if (round > 0 && !same_cost(dist[last], best_cost)) break;
    best_cost = dist[last];
    Path path;
    for (int l = last; l >= 0; l = prev[l]) path.links.push_back(l);
    std::reverse(path.links.begin(), path.links.end());
    path.bottleneck = std::numeric_limits<double>::infinity();
    for (int l : path.links) {
      path.latency += links_[l].latency;
      path.bottleneck = std::min(path.bottleneck, links_[l].bandwidth);
      banned[l] = 1;
    }
    route.latency = std::max(route.latency, path.latency);
    route.bandwidth += path.bottleneck;
    route.paths.push_back(std::move(path));
  }
  if (route.paths.empty()) {
    throw std::invalid_argument("no route from " + vertices_[src].name + " to " + vertices_[dst].name);
  }
  return route;
}

int Topology::translate_link(int link, int from_a, int to_a, int from_b, int to_b) const {
  int node = links_per_node_ ? link / links_per_node_ : -1;
  if (node >= nodes_) return link;  // shared link
  int local = link % links_per_node_;
  if (node == from_a) return to_a * links_per_node_ + local;
  if (node == from_b) return to_b * links_per_node_ + local;
  return link;
}

const Route& Topology::route(int src, int dst) const {
  if (src == dst) throw std::invalid_argument("route from " + vertices_.at(src).name + " to itself");
  const int64_t n = static_cast<int64_t>(vertices_.size());
  std::lock_guard<std::mutex> lock(cache_->mutex);
  auto& routes_ = cache_->routes;
  auto key = static_cast<int64_t>(src) * n + dst;
  if (auto it = routes_.find(key); it != routes_.end()) return *it->second;

  int a = node_of(src), b = node_of(dst);
  Route result;
  if (a < 0 || b < 0 || (a == 0 && b <= 1)) {
    result = compute_route(src, dst);
  } else {
    // Same shape as a route within node 0, or from node 0 to node 1.
    int cb = a == b ? 0 : 1;
    int csrc = src - a * vertices_per_node_;
    int cdst = dst - b * vertices_per_node_ + cb * vertices_per_node_;
    int64_t ckey = static_cast<int64_t>(csrc) * n + cdst;
    auto it = routes_.find(ckey);
    if (it == routes_.end()) {
      it = routes_.emplace(ckey, std::make_unique<Route>(compute_route(csrc, cdst))).first;
    }
    result = *it->second;
    for (Path& p : result.paths) {
      for (int& l : p.links) l = translate_link(l, 0, a, 1, b);
    }
  }
  return *routes_.emplace(key, std::make_unique<Route>(std::move(result))).first->second;
}

}  // namespace zion::sim

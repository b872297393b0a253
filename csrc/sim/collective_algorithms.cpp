// Plans of the flat collective algorithms: ring, direct, halving-doubling,
// double binary tree and in-switch reduction. (Hierarchical plans compose
// these per level; see collective_model.cpp.)

#include <algorithm>
#include <functional>

#include "collective_plan.h"

namespace zion::sim {
namespace {

using Op = CollectiveOp;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Ring reduce-scatter or all-gather: n-1 steps, each rank passing one
// 1/n-chunk to its neighbour. The chunk is split evenly over the context's
// rings (one, in rank order, unless given); with `bidirectional`, each ring
// also runs the other way and each direction carries half of its share.
PlanStep ring_step(const PlanContext& c, double chunk, bool reduce) {
  int n = static_cast<int>(c.vertices.size());
  std::vector<const std::vector<int>*> rings;
  if (c.rings.empty()) rings.push_back(&c.vertices);
  for (const auto& r : c.rings) rings.push_back(&r);
  bool both_ways = c.bidirectional && n > 2;
  double part = chunk / static_cast<double>(rings.size()) / (both_ways ? 2 : 1);
  PlanStep step;
  step.repeat = n - 1;
  for (const std::vector<int>* ring : rings) {
    const auto& v = *ring;
    for (int i = 0; i < n; ++i) {
      step.flows.push_back({v[i], v[(i + 1) % n], part, reduce ? part : 0});
      if (both_ways) step.flows.push_back({v[i], v[(i + n - 1) % n], part, reduce ? part : 0});
    }
  }
  return step;
}

// A pipelined chain root -> root+1 -> ... (broadcast) or its reverse
// (reduce), the data cut into `pipeline_chunks` pieces. With rings given,
// one chain runs down each ring from the root (and, with `bidirectional`,
// one up it), each carrying an even share of the data on its own links.
Plan chain(const PlanContext& c, double bytes, bool reduce) {
  int n = static_cast<int>(c.vertices.size());
  const int root = c.vertices[c.root];
  std::vector<std::vector<int>> chains;  // each from the root
  if (c.rings.empty()) {
    chains.emplace_back();
    for (int j = 0; j < n; ++j) chains.back().push_back(c.vertices[(c.root + j) % n]);
  }
  for (const auto& ring : c.rings) {
    int start = static_cast<int>(std::find(ring.begin(), ring.end(), root) - ring.begin());
    for (int way : {1, -1}) {
      if (way < 0 && !(c.bidirectional && n > 2)) break;
      chains.emplace_back();
      for (int j = 0; j < n; ++j) chains.back().push_back(ring[((start + way * j) % n + n) % n]);
    }
  }
  int k = std::max(1, c.pipeline_chunks);
  double piece = bytes / k / static_cast<double>(chains.size());
  Plan plan;
  for (int s = 0; s < k + n - 2; ++s) {
    PlanStep step;
    for (const auto& member : chains) {  // member[j]: j-th on the chain from the root
      for (int j = 0; j + 1 < n; ++j) {
        int chunk = s - j;
        if (chunk < 0 || chunk >= k) continue;
        if (reduce) {
          // Reduction flows towards the root: link j carries member n-1-j -> n-2-j.
          step.flows.push_back({member[n - 1 - j], member[n - 2 - j], piece, piece});
        } else {
          step.flows.push_back({member[j], member[j + 1], piece, 0});
        }
      }
    }
    plan.push_back(std::move(step));
  }
  return plan;
}

// Depth-first search for rings of direct links through every participant,
// each ring's links taken before the next is looked for, keeping the
// largest set found (at most half the smallest degree: a ring uses two of
// each vertex's links).
class RingSearch {
 public:
  explicit RingSearch(std::vector<std::vector<char>> links) : n_(static_cast<int>(links.size())), free_(std::move(links)) {
    int min_degree = n_;
    for (const auto& row : free_) min_degree = std::min(min_degree, static_cast<int>(std::count(row.begin(), row.end(), 1)));
    most_ = min_degree / 2;
  }

  std::vector<std::vector<int>> run() {
    if (most_ > 0) next_ring();
    return best_;
  }

 private:
  // Looks for one more ring on the links left; true when the search is over.
  bool next_ring() {
    std::vector<int> path{0};
    std::vector<char> on(n_, 0);
    on[0] = 1;
    return extend(path, on);
  }

  bool extend(std::vector<int>& path, std::vector<char>& on) {
    if (--budget_ < 0) return true;
    int at = path.back();
    if (static_cast<int>(path.size()) == n_) {
      // Each ring is met in both directions; take it in one.
      return free_[at][0] && path[1] < at && take(path);
    }
    for (int j = 1; j < n_; ++j) {
      if (on[j] || !free_[at][j]) continue;
      on[j] = 1;
      path.push_back(j);
      bool over = extend(path, on);
      path.pop_back();
      on[j] = 0;
      if (over) return true;
    }
    return false;
  }

  bool take(const std::vector<int>& ring) {
    auto mark = [&](char value) {
      for (int i = 0; i < n_; ++i) {
        int a = ring[i], b = ring[(i + 1) % n_];
        free_[a][b] = free_[b][a] = value;
      }
    };
    mark(0);
    current_.push_back(ring);
    if (current_.size() > best_.size()) best_ = current_;
    bool over = static_cast<int>(best_.size()) == most_ || next_ring();
    current_.pop_back();
    mark(1);
    return over;
  }

  int n_;
  std::vector<std::vector<char>> free_;  // free_[i][j]: a direct link both ways that no ring of current_ uses
  int most_ = 0;
  long budget_ = 1 << 20;  // steps of the search: bounds it on meshes with many rings
  std::vector<std::vector<int>> current_, best_;
};

PlanOutcome ring(Op op, double bytes, const PlanContext& c) {
  int n = static_cast<int>(c.vertices.size());
  Plan plan;
  switch (op) {
    case Op::kAllReduce:
      plan.push_back(ring_step(c, bytes / n, true));
      plan.push_back(ring_step(c, bytes / n, false));
      break;
    case Op::kReduceScatter: plan.push_back(ring_step(c, bytes / n, true)); break;
    case Op::kAllGather: plan.push_back(ring_step(c, bytes / n, false)); break;
    case Op::kBroadcast: plan = chain(c, bytes, false); break;
    case Op::kReduce: plan = chain(c, bytes, true); break;
    case Op::kAllToAll:
      // Pairwise exchange around the ring: in step k rank i sends to i+k.
      for (int k = 1; k < n; ++k) {
        PlanStep step;
        for (int i = 0; i < n; ++i) {
          int j = (i + k) % n;
          double b = c.all_to_all_bytes ? (*c.all_to_all_bytes)[i][j] : bytes / n;
          step.flows.push_back({c.vertices[i], c.vertices[j], b, 0});
        }
        plan.push_back(std::move(step));
      }
      break;
    case Op::kSendRecv: return {{}, "send_recv is one transfer; use algorithm direct"};
  }
  return {std::move(plan), ""};
}

PlanOutcome direct(Op op, double bytes, const PlanContext& c) {
  const auto& v = c.vertices;
  int n = static_cast<int>(v.size());
  auto all_pairs = [&](double b, bool reduce) {
    PlanStep step;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (i != j) step.flows.push_back({v[i], v[j], b, reduce ? b : 0});
      }
    }
    return step;
  };
  Plan plan;
  switch (op) {
    case Op::kAllReduce:
      plan.push_back(all_pairs(bytes / n, true));
      plan.push_back(all_pairs(bytes / n, false));
      break;
    case Op::kReduceScatter: plan.push_back(all_pairs(bytes / n, true)); break;
    case Op::kAllGather: plan.push_back(all_pairs(bytes / n, false)); break;
    case Op::kAllToAll: {
      PlanStep step;
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          double b = c.all_to_all_bytes ? (*c.all_to_all_bytes)[i][j] : bytes / n;
          if (i != j) step.flows.push_back({v[i], v[j], b, 0});
        }
      }
      plan.push_back(std::move(step));
      break;
    }
    case Op::kBroadcast:
    case Op::kReduce: {
      PlanStep step;
      for (int i = 0; i < n; ++i) {
        if (i == c.root) continue;
        if (op == Op::kBroadcast) step.flows.push_back({v[c.root], v[i], bytes, 0});
        else step.flows.push_back({v[i], v[c.root], bytes, bytes});
      }
      plan.push_back(std::move(step));
      break;
    }
    case Op::kSendRecv: plan.push_back({{{v[0], v[1], bytes, 0}}, 1}); break;
  }
  return {std::move(plan), ""};
}

// Recursive halving (reduce-scatter) and recursive doubling (all-gather):
// log2(n) steps of pairwise exchanges with partners i XOR d.
PlanOutcome halving_doubling(Op op, double bytes, const PlanContext& c) {
  const auto& v = c.vertices;
  int n = static_cast<int>(v.size());
  if (!is_power_of_two(n)) {
    return {{}, "halving_doubling needs a power-of-two number of ranks, got " + std::to_string(n)};
  }
  if (op != Op::kAllReduce && op != Op::kReduceScatter && op != Op::kAllGather) {
    return {{}, std::string("halving_doubling runs all_reduce, reduce_scatter and all_gather, not ") + collective_op_name(op)};
  }
  auto exchange = [&](int distance, double b, bool reduce) {
    PlanStep step;
    for (int i = 0; i < n; ++i) step.flows.push_back({v[i], v[i ^ distance], b, reduce ? b : 0});
    return step;
  };
  Plan plan;
  if (op != Op::kAllGather) {
    double b = bytes;
    for (int d = n / 2; d >= 1; d /= 2) plan.push_back(exchange(d, b /= 2, true));
  }
  if (op != Op::kReduceScatter) {
    double b = bytes / n;
    for (int d = 1; d < n; d *= 2, b *= 2) plan.push_back(exchange(d, b, false));
  }
  return {std::move(plan), ""};
}

// Two in-order binary trees over the ranks, the second shifted by one so
// that the first tree's leaves are the second's inner nodes (NCCL's double
// binary tree). Each tree reduces half the data up and broadcasts it back
// down, pipelined in `pipeline_chunks` pieces.
PlanOutcome double_binary_tree(Op op, double bytes, const PlanContext& c) {
  int n = static_cast<int>(c.vertices.size());
  if (op != Op::kAllReduce) {
    return {{}, std::string("double_binary_tree runs all_reduce only, not ") + collective_op_name(op)};
  }
  std::vector<int> parent(n, -1), height(n, 0), depth(n, 0);
  std::function<int(int, int, int)> build = [&](int lo, int hi, int d) -> int {
    if (lo > hi) return -1;
    int mid = (lo + hi) / 2;
    depth[mid] = d;
    for (int child : {build(lo, mid - 1, d + 1), build(mid + 1, hi, d + 1)}) {
      if (child >= 0) {
        parent[child] = mid;
        height[mid] = std::max(height[mid], height[child] + 1);
      }
    }
    return mid;
  };
  int root = build(0, n - 1, 0);
  int tree_height = height[root];
  int k = std::max(1, c.pipeline_chunks);
  double piece = bytes / 2 / k;
  int steps = k + 2 * tree_height - 1;
  Plan plan(std::max(steps, 1));
  for (int shift = 0; shift < 2; ++shift) {
    auto vertex = [&](int pos) { return c.vertices[(pos + shift) % n]; };
    for (int u = 0; u < n; ++u) {
      if (parent[u] < 0) continue;
      for (int chunk = 0; chunk < k; ++chunk) {
        // Up: u sends chunk once its subtree has reduced it. Down: the parent
        // forwards chunk after the root has it.
        plan[chunk + height[u]].flows.push_back({vertex(u), vertex(parent[u]), piece, piece});
        plan[chunk + tree_height + depth[parent[u]]].flows.push_back({vertex(parent[u]), vertex(u), piece, 0});
      }
    }
  }
  return {std::move(plan), ""};
}

// In-switch reduction (NVLink SHARP style): ranks push data into the fabric
// switch, which reduces it and multicasts the result back; pipelined so the
// up and down directions overlap.
PlanOutcome in_switch(Op op, double bytes, const PlanContext& c) {
  if (c.fabric_switch < 0) {
    return {{}, "in_switch needs all ranks on one fabric switch that reduces (fabric.topology = switch, fabric.in_switch_reduction = true)"};
  }
  int n = static_cast<int>(c.vertices.size());
  double up = 0, down = 0;
  bool reduce = true;
  switch (op) {
    case Op::kAllReduce: up = bytes, down = bytes; break;
    case Op::kReduceScatter: up = bytes * (n - 1) / n, down = bytes / n; break;
    case Op::kAllGather: up = bytes / n, down = bytes * (n - 1) / n, reduce = false; break;
    default:
      return {{}, std::string("in_switch runs all_reduce, reduce_scatter and all_gather, not ") + collective_op_name(op)};
  }
  int k = std::max(1, c.pipeline_chunks);
  // The switch's reduction reaches only part of the link bandwidth: charged
  // as that many more bytes on the wire.
  double scale = 1.0 / c.in_switch_efficiency;
  Plan plan;
  for (int s = 0; s <= k; ++s) {
    PlanStep step;
    for (int v : c.vertices) {
      if (s < k) step.flows.push_back({v, c.fabric_switch, up / k * scale, reduce ? up / k : 0});
      if (s > 0) step.flows.push_back({c.fabric_switch, v, down / k * scale, 0});
    }
    plan.push_back(std::move(step));
  }
  return {std::move(plan), ""};
}

}  // namespace

std::vector<std::vector<int>> link_disjoint_rings(const Topology& topology, const std::vector<int>& vertices) {
  int n = static_cast<int>(vertices.size());
  if (n < 3) return {};
  std::vector<std::vector<char>> links(n, std::vector<char>(n, 0));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      links[i][j] = i != j && topology.adjacent(vertices[i], vertices[j]) && topology.adjacent(vertices[j], vertices[i]);
    }
  }
  std::vector<std::vector<int>> rings = RingSearch(std::move(links)).run();
  for (auto& ring : rings) {
    for (int& i : ring) i = vertices[i];
  }
  return rings;
}

PlanOutcome build_plan(Algorithm algorithm, CollectiveOp op, double bytes, const PlanContext& ctx) {
  if (ctx.vertices.size() < 2) return {{}, "needs at least 2 ranks"};
  switch (algorithm) {
    case Algorithm::kRing: return ring(op, bytes, ctx);
    case Algorithm::kDirect: return direct(op, bytes, ctx);
    case Algorithm::kHalvingDoubling: return halving_doubling(op, bytes, ctx);
    case Algorithm::kDoubleBinaryTree: return double_binary_tree(op, bytes, ctx);
    case Algorithm::kInSwitch: return in_switch(op, bytes, ctx);
    default: return {{}, std::string(algorithm_name(algorithm)) + " is not a flat algorithm"};
  }
}

}  // namespace zion::sim

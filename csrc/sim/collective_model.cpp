#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "collective_plan.h"
#include "platform_topology.h"

namespace zion::sim {
namespace {

// `auto` skips an algorithm whose plan has no closed form and would need
// more transfers than this to simulate (e.g. trees over a thousand ranks).
constexpr size_t kAutoSimulationLimit = 5000;
constexpr size_t kCacheLimit = 1 << 14;
// Above this many transfers even a forced algorithm is estimated step by
// step instead of simulated transfer by transfer.
constexpr size_t kSimulationLimit = 200000;
// `hierarchical` with auto levels does not consider plans with more flows
// per step than this (all-pairs among a hundred nodes).
constexpr size_t kLevelFlowLimit = 4096;

const std::vector<std::pair<CollectiveOp, const char*>> kOps = {
    {CollectiveOp::kAllReduce, "all_reduce"}, {CollectiveOp::kReduceScatter, "reduce_scatter"},
    {CollectiveOp::kAllGather, "all_gather"}, {CollectiveOp::kAllToAll, "all_to_all"},
    {CollectiveOp::kBroadcast, "broadcast"},  {CollectiveOp::kReduce, "reduce"},
    {CollectiveOp::kSendRecv, "send_recv"}};
const std::vector<std::pair<Algorithm, const char*>> kAlgorithms = {
    {Algorithm::kAuto, "auto"},
    {Algorithm::kRing, "ring"},
    {Algorithm::kDirect, "direct"},
    {Algorithm::kHalvingDoubling, "halving_doubling"},
    {Algorithm::kDoubleBinaryTree, "double_binary_tree"},
    {Algorithm::kHierarchical, "hierarchical"},
    {Algorithm::kInSwitch, "in_switch"}};

template <typename E>
std::string allowed_names(const std::vector<std::pair<E, const char*>>& table) {
  std::string out;
  for (const auto& [e, name] : table) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

struct Timed {
  Seconds time = 0;
  bool closed_form = false;
  int transfers = 0;
};

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  for (const auto& [o, name] : kOps) {
    if (o == op) return name;
  }
  return "?";
}

CollectiveOp parse_collective_op(const std::string& name) {
  for (const auto& [o, n] : kOps) {
    if (name == n) return o;
  }
  throw std::invalid_argument("unknown collective '" + name + "'; allowed: " + allowed_names(kOps));
}

const char* algorithm_name(Algorithm a) {
  for (const auto& [x, name] : kAlgorithms) {
    if (x == a) return name;
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& name) {
  for (const auto& [a, n] : kAlgorithms) {
    if (name == n) return a;
  }
  throw std::invalid_argument("unknown collective algorithm '" + name + "'; allowed: " + allowed_names(kAlgorithms));
}

const std::vector<Algorithm>& concrete_algorithms() {
  static const std::vector<Algorithm> all = {Algorithm::kRing, Algorithm::kDirect, Algorithm::kHalvingDoubling,
                                             Algorithm::kDoubleBinaryTree, Algorithm::kHierarchical,
                                             Algorithm::kInSwitch};
  return all;
}

double bus_bandwidth_factor(CollectiveOp op, int n) {
  switch (op) {
    case CollectiveOp::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllGather:
    case CollectiveOp::kAllToAll: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

// Plans for the participants of one request, with what the model knows
// about levels and switches.
struct CollectiveModel::Internals {
  const CollectiveModel& model;
  const CollectiveRequest& request;
  AstraParams astra;

  PlanContext context(const std::vector<int>& devices, int root) const {
    PlanContext c{*model.topology_, {}};
    for (int d : devices) c.vertices.push_back(model.device_vertex_[d]);
    c.root = root;
    c.pipeline_chunks = model.settings_.pipeline_chunks;
    c.bidirectional = request.mode != LinkMode::kAstra;  // ASTRA-sim's rings run one way
    c.in_switch_efficiency = model.settings_.in_switch_efficiency;
    if (model.settings_.in_switch_reduction) {
      std::set<int> nodes;
      for (int d : devices) nodes.insert(d / std::max(1, model.devices_per_node_));
      if (nodes.size() == 1 && model.devices_per_node_ > 0) c.fabric_switch = model.fabric_switch_of_node_[*nodes.begin()];
    }
    if (!request.all_to_all_bytes.empty()) c.all_to_all_bytes = &request.all_to_all_bytes;
    return c;
  }

  // `beat`: the time to beat (auto's best so far, fixed latency excluded);
  // a plan whose lower bound cannot beat it is not simulated.
  Timed time_plan(const Plan& plan, bool may_simulate_large,
                  Seconds beat = std::numeric_limits<double>::infinity()) const {
    Timed t;
    if (!request.force_simulation) {
      if (auto cf = closed_form_time(plan, *model.topology_, request.mode, astra)) {
        return {*cf, true, 0};
      }
    }
    if (request.mode != LinkMode::kAstra && std::isfinite(beat) && critical_path_time(plan, *model.topology_) >= beat) {
      t.time = std::numeric_limits<double>::infinity();
      return t;
    }
    if (unrolled_flow_count(plan) > kSimulationLimit) {
      // Too many transfers to simulate one by one (a ring over a thousand
      // ranks across nodes): step-synchronous estimate, paced by the slowest flow.
      t.time = step_synchronous_time(plan, *model.topology_, request.mode, astra);
      return t;
    }
    if (!may_simulate_large && unrolled_flow_count(plan) > kAutoSimulationLimit) {
      t.time = std::numeric_limits<double>::infinity();
      return t;
    }
    t.time = simulate_plan(plan, *model.topology_, request.mode, astra, 1, &t.transfers);
    return t;
  }

  // Hierarchical: reduce-scatter inside each level, innermost first, then
  // all-gather back out; each level runs its groups side by side.
  PlanOutcome hierarchical(CollectiveOp op, double bytes, const std::vector<int>& devices) const {
    if (op != CollectiveOp::kAllReduce && op != CollectiveOp::kReduceScatter && op != CollectiveOp::kAllGather) {
      return {{}, std::string("hierarchical runs all_reduce, reduce_scatter and all_gather, not ") + collective_op_name(op)};
    }
    size_t levels = model.level_sizes_.size();
    std::vector<std::vector<std::vector<int>>> groups(levels);  // [level][group] -> devices
    std::vector<int> level_size(levels, 1);
    int active_levels = 0;
    for (size_t k = 0; k < levels; ++k) {
      std::map<std::vector<int>, std::vector<int>> by_rest;
      for (int d : devices) {
        auto key = model.device_coords_[d];
        key[k] = -1;
        by_rest[key].push_back(d);
      }
      for (auto& [key, members] : by_rest) groups[k].push_back(members);
      level_size[k] = static_cast<int>(groups[k].front().size());
      for (const auto& g : groups[k]) {
        if (static_cast<int>(g.size()) != level_size[k]) {
          return {{}, "hierarchical needs the same number of ranks in every group of level " + std::to_string(k)};
        }
      }
      if (level_size[k] > 1) ++active_levels;
    }
    size_t product = 1;
    for (int s : level_size) product *= s;
    if (product != devices.size()) return {{}, "hierarchical needs the ranks to form a full grid of the levels"};
    if (active_levels < 2) return {{}, "hierarchical needs ranks on more than one node (or dimension)"};

    auto phase = [&](size_t k, CollectiveOp part, double size) -> PlanOutcome {
      std::vector<Plan> plans;
      Algorithm chosen = k < model.settings_.level_algorithms.size() ? model.settings_.level_algorithms[k] : Algorithm::kAuto;
      if (chosen == Algorithm::kAuto) chosen = fastest_level_algorithm(part, size, groups[k].front());
      for (const auto& g : groups[k]) {
        PlanOutcome o = build_plan(chosen, part, size, context(g, 0));
        if (!o.not_applicable.empty()) return o;
        plans.push_back(std::move(o.plan));
      }
      return {merge_parallel(plans), ""};
    };
    Plan plan;
    std::vector<double> sizes(levels);
    double size = bytes;
    for (size_t k = 0; k < levels; ++k) {
      sizes[k] = size;
      if (level_size[k] > 1) size /= level_size[k];
    }
    if (op != CollectiveOp::kAllGather) {
      for (size_t k = 0; k < levels; ++k) {
        if (level_size[k] == 1) continue;
        PlanOutcome o = phase(k, CollectiveOp::kReduceScatter, sizes[k]);
        if (!o.not_applicable.empty()) return o;
        append_plan(plan, o.plan);
      }
    }
    if (op != CollectiveOp::kReduceScatter) {
      for (size_t k = levels; k-- > 0;) {
        if (level_size[k] == 1) continue;
        PlanOutcome o = phase(k, CollectiveOp::kAllGather, sizes[k]);
        if (!o.not_applicable.empty()) return o;
        append_plan(plan, o.plan);
      }
    }
    return {std::move(plan), ""};
  }

  Algorithm fastest_level_algorithm(CollectiveOp op, double bytes, const std::vector<int>& group) const {
    Algorithm best = Algorithm::kRing;
    double best_time = std::numeric_limits<double>::infinity();
    size_t n = group.size();
    for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect, Algorithm::kHalvingDoubling, Algorithm::kInSwitch}) {
      if (a == Algorithm::kDirect && n * (n - 1) > kLevelFlowLimit) continue;  // all pairs of a hundred nodes
      PlanOutcome o = build_plan(a, op, bytes, context(group, 0));
      if (!o.not_applicable.empty()) continue;
      bool too_wide = false;
      for (const PlanStep& s : o.plan) too_wide = too_wide || s.flows.size() > kLevelFlowLimit;
      if (too_wide) continue;
      Timed t = time_plan(o.plan, false);
      if (t.time < best_time) best_time = t.time, best = a;
    }
    return best;
  }

  PlanOutcome plan_for(Algorithm a, double bytes) const {
    if (a == Algorithm::kHierarchical) return hierarchical(request.op, bytes, request.devices);
    return build_plan(a, request.op, bytes, context(request.devices, request.root));
  }

  // Time of one algorithm, or +inf with the reason it does not apply.
  Timed time_algorithm(Algorithm a, bool forced, std::string* why, Seconds beat) const {
    const auto& s = model.settings_;
    if (request.mode == LinkMode::kAstra) {
      // ASTRA-sim cuts the collective into dataset splits and runs
      // `active_chunks_per_dimension` of them at a time; each chunk ends with
      // one more endpoint delay.
      int splits = s.astra.preferred_dataset_splits;
      int active = std::min(splits, s.astra.active_chunks_per_dimension);
      PlanOutcome o = plan_for(a, request.bytes / splits);
      if (!o.not_applicable.empty()) {
        *why = o.not_applicable;
        return {std::numeric_limits<double>::infinity(), false, 0};
      }
      Timed chunk;
      if (active == 1) {
        chunk = time_plan(o.plan, forced);
      } else {
        chunk.time = simulate_plan(o.plan, *model.topology_, request.mode, astra, active, &chunk.transfers);
      }
      int waves = (splits + active - 1) / active;
      return {waves * (chunk.time + s.astra.endpoint_delay), chunk.closed_form, chunk.transfers * waves};
    }
    PlanOutcome o = plan_for(a, request.bytes);
    if (!o.not_applicable.empty()) {
      *why = o.not_applicable;
      return {std::numeric_limits<double>::infinity(), false, 0};
    }
    Timed t = time_plan(o.plan, forced, beat - s.base_latency);
    t.time += s.base_latency;
    return t;
  }
};

CollectiveModel::CollectiveModel(const Platform& p)
    : topology_(std::make_shared<Topology>(build_topology(p))), devices_per_node_(p.oam.count) {
  settings_.base_latency = p.collectives.base_latency;
  settings_.pipeline_chunks = p.collectives.pipeline_chunks;
  settings_.astra = p.collectives.astra;
  settings_.local_memory_bandwidth = p.oam.hbm_bandwidth;
  settings_.in_switch_reduction = p.fabric.in_switch_reduction;
  settings_.in_switch_efficiency = p.fabric.in_switch_reduction_efficiency;
  settings_.default_algorithm = parse_algorithm(p.collectives.algorithm);
  for (const auto& a : p.collectives.algorithms) settings_.auto_algorithms.push_back(parse_algorithm(a));
  level_sizes_ = {p.oam.count, p.nodes};
  for (int d = 0; d < p.total_devices(); ++d) {
    device_vertex_.push_back(zion::sim::device_vertex(*topology_, p, d));
    device_coords_.push_back({d % p.oam.count, d / p.oam.count});
  }
  for (int node = 0; node < p.nodes; ++node) fabric_switch_of_node_.push_back(topology_->find(VertexKind::kFabricSwitch, node, 0));
}

CollectiveModel::CollectiveModel(std::shared_ptr<const Topology> topology, std::vector<int> level_sizes,
                                 CollectiveSettings settings)
    : topology_(std::move(topology)),
      settings_(std::move(settings)),
      level_sizes_(std::move(level_sizes)) {
  int total = 1;
  for (int s : level_sizes_) total *= s;
  if (total != static_cast<int>(topology_->vertices().size()) &&
      total > static_cast<int>(topology_->vertices().size())) {
    throw std::invalid_argument("levels of " + std::to_string(total) + " NPUs do not fit a topology of " +
                                std::to_string(topology_->vertices().size()) + " vertices");
  }
  for (int d = 0; d < total; ++d) {
    device_vertex_.push_back(d);
    std::vector<int> coords;
    int rest = d;
    for (int s : level_sizes_) {
      coords.push_back(rest % s);
      rest /= s;
    }
    device_coords_.push_back(std::move(coords));
  }
}

int CollectiveModel::device_vertex(int device) const {
  if (device < 0 || device >= device_count()) {
    throw std::out_of_range("device " + std::to_string(device) + " does not exist; this machine has " +
                            std::to_string(device_count()) + " devices (0.." + std::to_string(device_count() - 1) + ")");
  }
  return device_vertex_[device];
}

void CollectiveModel::validate(const CollectiveRequest& r) const {
  const char* op = collective_op_name(r.op);
  if (r.devices.empty()) throw std::invalid_argument(std::string(op) + ": no ranks given");
  std::set<int> seen;
  for (int d : r.devices) {
    device_vertex(d);
    if (!seen.insert(d).second) throw std::invalid_argument(std::string(op) + ": device " + std::to_string(d) + " is listed twice");
  }
  if (!(r.bytes >= 0) || !std::isfinite(r.bytes)) {
    throw std::invalid_argument(std::string(op) + ": size must be a finite number of bytes >= 0");
  }
  int n = static_cast<int>(r.devices.size());
  if (r.root < 0 || r.root >= n) {
    throw std::invalid_argument(std::string(op) + ": root " + std::to_string(r.root) + " is not a rank (0.." + std::to_string(n - 1) + ")");
  }
  if (r.op == CollectiveOp::kSendRecv && n != 2) {
    throw std::invalid_argument("send_recv takes exactly 2 devices (sender, receiver), got " + std::to_string(n));
  }
  if (!r.all_to_all_bytes.empty()) {
    if (r.op != CollectiveOp::kAllToAll) throw std::invalid_argument(std::string(op) + ": per-peer sizes are for all_to_all only");
    bool square = static_cast<int>(r.all_to_all_bytes.size()) == n;
    for (const auto& row : r.all_to_all_bytes) {
      square = square && static_cast<int>(row.size()) == n;
      for (double b : row) {
        if (!(b >= 0) || !std::isfinite(b)) throw std::invalid_argument("all_to_all: per-peer sizes must be finite and >= 0");
      }
    }
    if (!square) throw std::invalid_argument("all_to_all: per-peer sizes must be a " + std::to_string(n) + "x" + std::to_string(n) + " matrix");
  }
}

CollectiveResult CollectiveModel::run(const CollectiveRequest& request) const {
  validate(request);
  std::string key;
  if (request.all_to_all_bytes.empty()) {
    std::ostringstream k;
    k << static_cast<int>(request.op) << '|' << std::hexfloat << request.bytes << '|' << static_cast<int>(request.algorithm)
      << '|' << static_cast<int>(request.mode) << '|' << request.root << '|' << request.force_simulation << '|';
    for (int d : request.devices) k << d << ',';
    key = k.str();
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  CollectiveResult result = compute(request);
  if (!key.empty()) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheLimit) cache_.clear();
    cache_.emplace(key, result);
  }
  return result;
}

CollectiveResult CollectiveModel::compute(const CollectiveRequest& request) const {
  Internals in{*this, request, {settings_.astra.endpoint_delay, settings_.local_memory_bandwidth}};
  int n = static_cast<int>(request.devices.size());
  CollectiveResult result;
  if (n == 1) {
    result.time = request.mode == LinkMode::kAstra ? 0 : settings_.base_latency;
    result.closed_form = true;
  } else {
    Algorithm wanted = request.algorithm == Algorithm::kAuto ? settings_.default_algorithm : request.algorithm;
    const auto& menu = settings_.auto_algorithms.empty() ? concrete_algorithms() : settings_.auto_algorithms;
    std::vector<Algorithm> candidates = wanted == Algorithm::kAuto ? menu : std::vector<Algorithm>{wanted};
    if (request.op == CollectiveOp::kSendRecv) candidates = {Algorithm::kDirect};
    std::string reasons;
    result.time = std::numeric_limits<double>::infinity();
    for (Algorithm a : candidates) {
      std::string why;
      Timed t = in.time_algorithm(a, wanted != Algorithm::kAuto, &why, result.time);
      if (!why.empty()) reasons += (reasons.empty() ? "" : "; ") + why;
      if (t.time < result.time) {
        result.time = t.time;
        result.algorithm = a;
        result.closed_form = t.closed_form;
        result.transfers = t.transfers;
      }
    }
    if (!std::isfinite(result.time)) {
      throw std::invalid_argument(std::string(collective_op_name(request.op)) + " over " + std::to_string(n) +
                                  " ranks: no algorithm applies (" + reasons + ")");
    }
  }
  double factor = bus_bandwidth_factor(request.op, n);
  result.algbw = result.time > 0 ? request.bytes / result.time : 0;
  result.busbw = result.algbw * factor;
  return result;
}

}  // namespace zion::sim

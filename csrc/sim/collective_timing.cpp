#include "collective_timing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>

namespace zion::sim {
namespace {

constexpr double kReferenceBytes = 1 << 30;  // sizes at which templates are fitted

// A binary key: tag bytes, then the ints.
std::string pack(std::initializer_list<int> head, const std::vector<int>& tail) {
  std::string key;
  key.reserve((head.size() + tail.size()) * sizeof(int));
  auto put = [&](int v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  for (int v : head) put(v);
  put(-1);
  for (int v : tail) put(v);
  return key;
}

void append_ints(std::string& key, const std::vector<Algorithm>& values) {
  for (Algorithm v : values) {
    int x = static_cast<int>(v);
    key.append(reinterpret_cast<const char*>(&x), sizeof x);
  }
}

Timed infinite() { return {}; }

}  // namespace

PlanContext CollectiveModel::Internals::context(const std::vector<int>& devices, int root) const {
  PlanContext c{*model.topology_, {}};
  c.vertices.reserve(devices.size());
  for (int d : devices) c.vertices.push_back(model.device_vertex_[d]);
  c.root = root;
  c.pipeline_chunks = model.settings_.pipeline_chunks;
  c.bidirectional = request.link_model != LinkModel::kAstra;  // ASTRA-sim's rings run one way
  c.in_switch_efficiency = model.settings_.in_switch_efficiency;
  if (model.settings_.in_switch_reduction && model.devices_per_node_ > 0) {
    int node = devices.front() / model.devices_per_node_;
    bool one_node = std::all_of(devices.begin(), devices.end(), [&](int d) { return d / model.devices_per_node_ == node; });
    if (one_node) c.fabric_switch = model.fabric_switch_of_node_[node];
  }
  c.rings = model.vertex_rings(c.vertices);
  if (!request.all_to_all_bytes.empty()) c.all_to_all_bytes = &request.all_to_all_bytes;
  return c;
}

std::shared_ptr<const CollectiveModel::Layout> CollectiveModel::Internals::layout(const std::vector<int>& devices) const {
  std::string key = pack({}, devices);
  {
    std::lock_guard<std::mutex> lock(model.cache_mutex_);
    if (auto it = model.layouts_.find(key); it != model.layouts_.end()) return it->second;
  }
  auto out = std::make_shared<Layout>();
  size_t levels = model.level_sizes_.size();
  out->groups.resize(levels);
  out->level_size.assign(levels, 1);
  int active_levels = 0;
  for (size_t k = 0; k < levels && out->not_applicable.empty(); ++k) {
    std::map<std::vector<int>, std::vector<int>> by_rest;  // other coordinates -> members
    for (int d : devices) {
      auto rest = model.device_coords_[d];
      rest[k] = -1;
      by_rest[rest].push_back(d);
    }
    for (auto& [rest, members] : by_rest) out->groups[k].push_back(std::move(members));
    out->level_size[k] = static_cast<int>(out->groups[k].front().size());
    for (const auto& g : out->groups[k]) {
      if (static_cast<int>(g.size()) != out->level_size[k]) {
        out->not_applicable = "hierarchical needs the same number of ranks in every group of level " + std::to_string(k);
      }
    }
    if (out->level_size[k] > 1) ++active_levels;
  }
  size_t product = 1;
  for (int s : out->level_size) product *= s;
  if (out->not_applicable.empty() && product != devices.size()) {
    out->not_applicable = "hierarchical needs the ranks to form a full grid of the levels";
  }
  if (out->not_applicable.empty() && active_levels < 2) {
    out->not_applicable = "hierarchical needs ranks on more than one node (or dimension)";
  }
  std::lock_guard<std::mutex> lock(model.cache_mutex_);
  if (model.layouts_.size() >= kTemplateCacheLimit) model.layouts_.clear();
  model.layouts_.emplace(key, out);
  return out;
}

// The phases of a hierarchical collective, in order: reduce-scatter per
// level innermost first, then all-gather per level outermost first.
namespace {
struct Phase {
  size_t level;
  CollectiveOp part;
};

std::vector<Phase> phases(CollectiveOp op, const std::vector<int>& level_size) {
  std::vector<Phase> out;
  size_t levels = level_size.size();
  if (op != CollectiveOp::kAllGather) {
    for (size_t k = 0; k < levels; ++k) {
      if (level_size[k] > 1) out.push_back({k, CollectiveOp::kReduceScatter});
    }
  }
  if (op != CollectiveOp::kReduceScatter) {
    for (size_t k = levels; k-- > 0;) {
      if (level_size[k] > 1) out.push_back({k, CollectiveOp::kAllGather});
    }
  }
  return out;
}

// Per-level sizes: level k works on bytes / (product of the inner levels).
std::vector<double> level_bytes(double bytes, const std::vector<int>& level_size) {
  std::vector<double> sizes;
  for (int s : level_size) {
    sizes.push_back(bytes);
    if (s > 1) bytes /= s;
  }
  return sizes;
}
}  // namespace

std::vector<Algorithm> CollectiveModel::Internals::level_choices(const Layout& l, double bytes) const {
  std::vector<Algorithm> choices;
  std::vector<double> sizes = level_bytes(bytes, l.level_size);
  for (const Phase& ph : phases(request.op, l.level_size)) {
    const auto& fixed = model.settings_.level_algorithms;
    if (ph.level < fixed.size() && fixed[ph.level] != Algorithm::kAuto) {
      choices.push_back(fixed[ph.level]);
      continue;
    }
    if (request.link_model == LinkModel::kAstra) {
      choices.push_back(Algorithm::kRing);  // ASTRA-sim's default implementation
      continue;
    }
    const std::vector<int>& group = l.groups[ph.level].front();
    size_t n = group.size();
    Algorithm best = Algorithm::kRing;
    double best_time = std::numeric_limits<double>::infinity();
    for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect, Algorithm::kHalvingDoubling, Algorithm::kInSwitch}) {
      if (a == Algorithm::kDirect && n * (n - 1) > kLevelFlowLimit) continue;  // all pairs of a hundred nodes
      std::string key = pack({2, static_cast<int>(ph.part), static_cast<int>(a), static_cast<int>(request.link_model)}, group);
      auto t = plan_template(key, [&](double b) { return build_plan(a, ph.part, b, context(group, 0)); });
      if (!t->closed_form) continue;
      double time = t->a + t->b * sizes[ph.level] + fixed_latency(a);
      if (time < best_time) best_time = time, best = a;
    }
    choices.push_back(best);
  }
  return choices;
}

PlanOutcome CollectiveModel::Internals::hierarchical_plan(double bytes, const Layout& l,
                                                          const std::vector<Algorithm>& choices) const {
  CollectiveOp op = request.op;
  if (op != CollectiveOp::kAllReduce && op != CollectiveOp::kReduceScatter && op != CollectiveOp::kAllGather) {
    return {{}, std::string("hierarchical runs all_reduce, reduce_scatter and all_gather, not ") + collective_op_name(op)};
  }
  if (!l.not_applicable.empty()) return {{}, l.not_applicable};
  std::vector<double> sizes = level_bytes(bytes, l.level_size);
  std::vector<Phase> list = phases(op, l.level_size);
  Plan plan;
  for (size_t i = 0; i < list.size(); ++i) {
    std::vector<Plan> groups;
    for (const auto& g : l.groups[list[i].level]) {
      PlanOutcome o = build_plan(choices.at(i), list[i].part, sizes[list[i].level], context(g, 0));
      if (!o.not_applicable.empty()) return o;
      groups.push_back(std::move(o.plan));
    }
    append_plan(plan, merge_parallel(groups));
  }
  return {std::move(plan), ""};
}

PlanOutcome CollectiveModel::Internals::plan(Algorithm a, double bytes, const std::vector<Algorithm>& choices) const {
  if (a == Algorithm::kHierarchical) return hierarchical_plan(bytes, *layout(request.devices), choices);
  return build_plan(a, request.op, bytes, context(request.devices, request.root));
}

std::shared_ptr<const CollectiveModel::Template> CollectiveModel::Internals::plan_template(
    const std::string& key, const std::function<PlanOutcome(double)>& build) const {
  {
    std::lock_guard<std::mutex> lock(model.cache_mutex_);
    if (auto it = model.templates_.find(key); it != model.templates_.end()) return it->second;
  }
  auto t = std::make_shared<Template>();
  PlanOutcome one = build(kReferenceBytes);
  if (!one.not_applicable.empty()) {
    t->not_applicable = one.not_applicable;
  } else if (auto t1 = closed_form_time(one.plan, *model.topology_, request.link_model, astra)) {
    // Symmetric steps: each lasts latency + bytes / rate, so the sum is
    // linear in size; two sizes fix it.
    PlanOutcome two = build(2 * kReferenceBytes);
    if (auto t2 = closed_form_time(two.plan, *model.topology_, request.link_model, astra)) {
      t->closed_form = true;
      t->b = (*t2 - *t1) / kReferenceBytes;
      t->a = *t1 - t->b * kReferenceBytes;
    }
  }
  bool too_large = t->not_applicable.empty() && !t->closed_form && unrolled_flow_count(one.plan) > kSimulationLimit;
  if (too_large && request.link_model != LinkModel::kAstra) {
    // Estimated step by step at any size: the lines, if a second size
    // confirms that every flow scales with size.
    std::vector<StepLines> steps = step_synchronous_lines(one.plan, *model.topology_, request.link_model, kReferenceBytes);
    PlanOutcome two = build(2 * kReferenceBytes);
    Seconds planned = step_synchronous_time(two.plan, *model.topology_, request.link_model, astra);
    Seconds fitted = step_synchronous_time(steps, 2 * kReferenceBytes);
    if (two.not_applicable.empty() && std::abs(fitted - planned) <= 1e-9 * planned) {
      t->stepwise = true;
      t->steps = std::move(steps);
    }
  }
  if (t->not_applicable.empty() && !t->closed_form && !too_large) {
    // Lower bound max(a, b * bytes): the critical path of latencies alone,
    // and the one of sizes alone (each linear in size).
    t->a = critical_path_time(build(0).plan, *model.topology_, true);
    t->b = critical_path_time(one.plan, *model.topology_, false) / kReferenceBytes;
  }
  std::lock_guard<std::mutex> lock(model.cache_mutex_);
  if (model.templates_.size() >= kTemplateCacheLimit) model.templates_.clear();
  model.templates_.emplace(key, t);
  return t;
}

Timed CollectiveModel::Internals::time_plan(const Plan& plan, bool forced) const {
  Timed t;
  if (!request.force_simulation) {
    if (auto cf = closed_form_time(plan, *model.topology_, request.link_model, astra)) return {*cf, true, 0};
  }
  size_t transfers = unrolled_flow_count(plan);
  if (transfers > kSimulationLimit) {
    // Too many transfers to simulate one by one (a ring over a thousand
    // ranks across nodes): step-synchronous estimate, paced by the slowest flow.
    t.time = step_synchronous_time(plan, *model.topology_, request.link_model, astra);
    return t;
  }
  if (!forced && transfers > kAutoSimulationLimit) return infinite();
  t.time = simulate_plan(plan, *model.topology_, request.link_model, astra, 1, &t.transfers);
  return t;
}

std::vector<Algorithm> CollectiveModel::Internals::choices_for(Algorithm a, std::string* why) const {
  if (a != Algorithm::kHierarchical) return {};
  auto l = layout(request.devices);
  if (!l->not_applicable.empty()) {
    *why = l->not_applicable;
    return {};
  }
  const auto& s = model.settings_;
  return level_choices(*l, request.link_model == LinkModel::kAstra ? request.bytes / s.astra.preferred_dataset_splits
                                                              : request.bytes);
}

std::shared_ptr<const CollectiveModel::Template> CollectiveModel::Internals::template_for(
    Algorithm a, const std::vector<Algorithm>& choices) const {
  std::string key = pack({1, static_cast<int>(request.op), static_cast<int>(a), static_cast<int>(request.link_model), request.root},
                         request.devices);
  append_ints(key, choices);
  return plan_template(key, [&](double bytes) { return plan(a, bytes, choices); });
}

Seconds CollectiveModel::Internals::estimate(Algorithm a) const {
  if (request.link_model == LinkModel::kAstra || !templated()) return 0;
  std::string why;
  std::vector<Algorithm> choices = choices_for(a, &why);
  if (!why.empty()) return std::numeric_limits<double>::infinity();
  auto t = template_for(a, choices);
  if (!t->not_applicable.empty()) return std::numeric_limits<double>::infinity();
  Seconds fixed = model.settings_.base_latency + fixed_latency(a, choices);
  if (t->closed_form) return fixed + t->a + t->b * request.bytes;
  if (t->stepwise) return fixed + step_synchronous_time(t->steps, request.bytes);
  return fixed + std::max(t->a, t->b * request.bytes);
}

Timed CollectiveModel::Internals::time_algorithm(Algorithm a, bool forced, std::string* why, Seconds beat) const {
  const auto& s = model.settings_;
  std::vector<Algorithm> choices = choices_for(a, why);
  if (!why->empty()) return infinite();
  if (request.link_model == LinkModel::kAstra) {
    // ASTRA-sim cuts the collective into dataset splits and runs
    // `active_chunks_per_dimension` of them at a time; each chunk ends with
    // one more endpoint delay.
    int splits = s.astra.preferred_dataset_splits;
    int active = std::min(splits, s.astra.active_chunks_per_dimension);
    PlanOutcome o = plan(a, request.bytes / splits, choices);
    if (!o.not_applicable.empty()) {
      *why = o.not_applicable;
      return infinite();
    }
    Timed chunk;
    if (active == 1) {
      chunk = time_plan(o.plan, forced);
    } else {
      chunk.time = simulate_plan(o.plan, *model.topology_, request.link_model, astra, active, &chunk.transfers);
    }
    int waves = (splits + active - 1) / active;
    return {waves * (chunk.time + s.astra.endpoint_delay), chunk.closed_form, chunk.transfers * waves};
  }

  if (templated()) {
    auto t = template_for(a, choices);
    if (!t->not_applicable.empty()) {
      *why = t->not_applicable;
      return infinite();
    }
    Seconds fixed = s.base_latency + fixed_latency(a, choices);
    if (t->closed_form) return {fixed + t->a + t->b * request.bytes, true, 0};
    if (t->stepwise) return {fixed + step_synchronous_time(t->steps, request.bytes), false, 0};
    if (std::max(t->a, t->b * request.bytes) + fixed >= beat) return infinite();
  }
  PlanOutcome o = plan(a, request.bytes, choices);
  if (!o.not_applicable.empty()) {
    *why = o.not_applicable;
    return infinite();
  }
  Timed t = time_plan(o.plan, forced);
  t.time += s.base_latency + fixed_latency(a, choices);
  return t;
}

namespace {
std::vector<double> plan_traffic(const Plan& plan, const Topology& topology) {
  std::vector<double> out(topology.link_classes().size(), 0.0);
  const auto& links = topology.links();
  for (const PlanStep& step : plan) {
    for (const PlanFlow& f : step.flows) {
      const Route& r = topology.route(f.src, f.dst);
      double per_path = f.bytes * step.repeat / static_cast<double>(r.paths.size());
      for (const auto& path : r.paths) {
        for (int l : path.links) out[links[l].link_class] += per_path;
      }
    }
  }
  return out;
}
}  // namespace

std::vector<double> CollectiveModel::Internals::link_class_bytes(Algorithm a) const {
  std::vector<Algorithm> choices;
  if (a == Algorithm::kHierarchical) {
    auto l = layout(request.devices);
    if (!l->not_applicable.empty()) throw std::invalid_argument(l->not_applicable);
    choices = level_choices(*l, request.bytes);
  }
  auto build = [&](double bytes) {
    PlanOutcome o = plan(a, bytes, choices);
    if (!o.not_applicable.empty()) throw std::invalid_argument(o.not_applicable);
    return plan_traffic(o.plan, *model.topology_);
  };
  if (!request.all_to_all_bytes.empty()) return build(request.bytes);
  std::string key = pack({3, static_cast<int>(request.op), static_cast<int>(a), request.root}, request.devices);
  append_ints(key, choices);
  std::vector<double> per_byte;
  {
    std::lock_guard<std::mutex> lock(model.cache_mutex_);
    if (auto it = model.traffic_per_byte_.find(key); it != model.traffic_per_byte_.end()) per_byte = it->second;
  }
  if (per_byte.empty()) {
    per_byte = build(kReferenceBytes);
    for (double& b : per_byte) b /= kReferenceBytes;
    std::lock_guard<std::mutex> lock(model.cache_mutex_);
    if (model.traffic_per_byte_.size() >= kTemplateCacheLimit) model.traffic_per_byte_.clear();
    model.traffic_per_byte_.emplace(key, per_byte);
  }
  for (double& b : per_byte) b *= request.bytes;
  return per_byte;
}

// In-switch collectives pay the switch's own setup (NCCL models NVLS with a
// latency of its own), once per in-switch phase.
Seconds CollectiveModel::Internals::fixed_latency(Algorithm a, const std::vector<Algorithm>& choices) const {
  Seconds per = model.settings_.in_switch_latency;
  if (a == Algorithm::kInSwitch) return per;
  return per * static_cast<double>(std::count(choices.begin(), choices.end(), Algorithm::kInSwitch));
}

}  // namespace zion::sim

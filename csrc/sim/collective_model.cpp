#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "collective_timing.h"
#include "nccl_tuning.h"
#include "platform_topology.h"

namespace zion::sim {

const char* collective_op_name(CollectiveOp op) { return name_of(kCollectiveOps, op); }

CollectiveOp parse_collective_op(const std::string& name) { return parse_name(kCollectiveOps, name, "collective"); }

std::vector<std::string> collective_op_names() { return names_of(kCollectiveOps); }

const char* algorithm_name(Algorithm a) { return name_of(kAlgorithms, a); }

Algorithm parse_algorithm(const std::string& name) { return parse_name(kAlgorithms, name, "collective algorithm"); }

std::vector<std::string> algorithm_names() { return names_of(kAlgorithms); }

const std::vector<Algorithm>& concrete_algorithms() {
  static const std::vector<Algorithm> all = [] {
    std::vector<Algorithm> out;
    for (const auto& entry : kAlgorithms) {
      if (entry.value != Algorithm::kAuto) out.push_back(entry.value);
    }
    return out;
  }();
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

CollectiveModel::CollectiveModel(const Platform& p)
    : topology_(std::make_shared<Topology>(build_topology(p))), devices_per_node_(p.oam.count) {
  settings_.base_latency = p.collectives.base_latency;
  settings_.pipeline_chunks = p.collectives.pipeline_chunks;
  settings_.astra = p.collectives.astra;
  settings_.local_memory_bandwidth = p.oam.hbm_bandwidth;
  settings_.in_switch_reduction = p.fabric.in_switch_reduction;
  settings_.in_switch_efficiency = p.fabric.in_switch_reduction_efficiency;
  settings_.in_switch_latency = p.fabric.in_switch_latency;
  settings_.link_disjoint_rings = p.fabric.topology == FabricTopology::kHybridCubeMesh;
  settings_.default_algorithm = parse_algorithm(p.collectives.algorithm);
  for (const auto& a : p.collectives.algorithms) settings_.auto_algorithms.push_back(parse_algorithm(a));
  level_sizes_ = {p.oam.count, p.nodes};
  for (int d = 0; d < p.total_devices(); ++d) {
    device_vertex_.push_back(zion::sim::device_vertex(*topology_, p, d));
    device_coords_.push_back({d % p.oam.count, d / p.oam.count});
  }
  for (int node = 0; node < p.nodes; ++node) fabric_switch_of_node_.push_back(topology_->find(VertexKind::kFabricSwitch, node, 0));
  if (p.collectives.nccl_tuner.enabled && p.fabric.topology == FabricTopology::kSwitch) {
    settings_.nccl_compute_capability = p.collectives.nccl_tuner.compute_capability;
    settings_.nccl_nvlink_gb_per_s = p.fabric.links_per_pair * p.fabric.link_bandwidth / kGB;
    settings_.nccl_nvls = p.fabric.in_switch_reduction;
    settings_.nccl_pipeline = p.collectives.nccl_tuner.time_model == "pipeline";
    settings_.nccl_amd_cpu = p.collectives.nccl_tuner.cpu_vendor == "amd";
    settings_.nccl_gpudirect = p.nic.gpudirect;
    // NCCL's GPU-to-NIC path: the NIC's speed and the PCIe links of the GPU
    // and of the NIC into their switch (topo.cc: width x per-lane figure).
    for (const auto& sw : p.pcie.switches) {
      CollectiveSettings::NcclPcieSwitch s;
      s.gpus = sw.oams;
      const double lane = p.pcie.lane_bandwidth(sw.generation);
      const double path = std::min({p.nic.bandwidth, sw.nic_lanes * lane, sw.oam_lanes * lane}) / kGB;
      s.nic_gb_per_s.assign(sw.nics.size(), path);
      settings_.nccl_pcie_switches.push_back(std::move(s));
    }
  }
}

std::shared_ptr<const NcclTuning> CollectiveModel::nccl_tuning_for(const CollectiveRequest& r) const {
  if (settings_.nccl_compute_capability == 0 || !NcclTuning::covers(r.op) || r.link_model != LinkModel::kFair ||
      r.devices.size() < 2 || devices_per_node_ == 0) {
    return nullptr;
  }
  const int n = static_cast<int>(r.devices.size());
  const int first_node = r.devices.front() / devices_per_node_;
  const bool one_node = std::all_of(r.devices.begin(), r.devices.end(),
                                    [&](int d) { return d / devices_per_node_ == first_node; });
  // The communicator's GPUs per node (local indices), when it spans several.
  std::map<int, std::set<int>> local_of_node;
  if (!one_node) {
    for (int d : r.devices) local_of_node[d / devices_per_node_].insert(d % devices_per_node_);
  }
  const int nodes = one_node ? 1 : static_cast<int>(local_of_node.size());
  int nics = 0;
  double nic_gb_per_s = 0;
  if (nodes > 1) {
    // Across nodes: the same GPUs on every node, two or more (one GPU per
    // node changes NCCL's graphs: no NVLink inside the node), and NICs that
    // reach GPU memory directly.
    const std::set<int>& local = local_of_node.begin()->second;
    for (const auto& [node, gpus] : local_of_node) {
      if (gpus != local) return nullptr;
    }
    if (local.size() < 2 || !settings_.nccl_gpudirect) return nullptr;
    // NICs at PIX distance: on a PCIe switch with two or more of the
    // communicator's GPUs, at most one per such GPU (a channel enters
    // through one GPU's PCIe link and leaves through another's).
    for (const auto& sw : settings_.nccl_pcie_switches) {
      int gpus = 0;
      for (int g : sw.gpus) gpus += static_cast<int>(local.count(g));
      if (gpus < 2 || sw.nic_gb_per_s.empty()) continue;
      const int use = std::min(gpus, static_cast<int>(sw.nic_gb_per_s.size()));
      for (int i = 0; i < use; ++i) {
        nic_gb_per_s = nics == 0 ? sw.nic_gb_per_s[i] : std::min(nic_gb_per_s, sw.nic_gb_per_s[i]);
        ++nics;
      }
    }
    if (nics == 0 || !(nic_gb_per_s > 0)) return nullptr;
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto& slot = nccl_tunings_[{n, nodes, nics, nic_gb_per_s}];
  if (!slot) {
    NcclTuningInput in;
    in.compute_capability = settings_.nccl_compute_capability;
    in.ranks = n;
    in.nvlink_gb_per_s = settings_.nccl_nvlink_gb_per_s;
    in.nvls = settings_.nccl_nvls;
    in.nodes = nodes;
    in.nics = nics;
    in.nic_gb_per_s = nic_gb_per_s;
    in.amd_cpu = settings_.nccl_amd_cpu;
    slot = std::make_shared<const NcclTuning>(in);
  }
  return slot;
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

std::vector<std::vector<int>> CollectiveModel::vertex_rings(const std::vector<int>& vertices) const {
  if (!settings_.link_disjoint_rings) return {};
  return link_disjoint_rings(*topology_, vertices);
}

std::vector<std::vector<int>> CollectiveModel::rings(const std::vector<int>& devices) const {
  std::vector<int> vertices;
  std::map<int, int> device_of;
  for (int d : devices) {
    vertices.push_back(device_vertex(d));
    device_of[vertices.back()] = d;
  }
  std::vector<std::vector<int>> out = vertex_rings(vertices);
  if (out.empty()) return {devices};
  for (auto& ring : out) {
    for (int& v : ring) v = device_of.at(v);
  }
  return out;
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
      << '|' << static_cast<int>(request.link_model) << '|' << request.root << '|' << request.force_simulation << '|';
    for (int d : request.devices) k << d << ',';
    key = k.str();
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  CollectiveResult result = compute(request);
  if (!key.empty()) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kResultCacheLimit) cache_.clear();
    cache_.emplace(key, result);
  }
  return result;
}

std::vector<double> CollectiveModel::link_class_bytes(const CollectiveRequest& request, Algorithm algorithm) const {
  validate(request);
  if (algorithm == Algorithm::kAuto) throw std::invalid_argument("link_class_bytes needs a concrete algorithm, not auto");
  if (request.devices.size() < 2) return std::vector<double>(topology_->link_classes().size(), 0.0);
  Internals in{*this, request, {settings_.astra.endpoint_delay, settings_.local_memory_bandwidth}};
  return in.link_class_bytes(request.op == CollectiveOp::kSendRecv ? Algorithm::kDirect : algorithm);
}

CollectiveResult CollectiveModel::compute(const CollectiveRequest& request) const {
  Internals in{*this, request, {settings_.astra.endpoint_delay, settings_.local_memory_bandwidth}};
  int n = static_cast<int>(request.devices.size());
  CollectiveResult result;
  const Algorithm asked = request.algorithm == Algorithm::kAuto ? settings_.default_algorithm : request.algorithm;
  std::shared_ptr<const NcclTuning> nccl = n > 1 && asked == Algorithm::kAuto ? nccl_tuning_for(request) : nullptr;
  if (n == 1) {
    // One rank moves nothing between devices. NCCL launches no kernel for an
    // in-place call (c10d's all_reduce, broadcast and reduce are in place)
    // and copies the input to the output of an out-of-place one (c10d's
    // all_gather, reduce_scatter and all_to_all), at the rate of a copy on
    // one device: its bytes read and written in HBM.
    const bool copies = request.op == CollectiveOp::kAllGather || request.op == CollectiveOp::kReduceScatter ||
                        request.op == CollectiveOp::kAllToAll;
    const Seconds copy = copies && settings_.local_memory_bandwidth > 0
                             ? 2 * request.bytes / settings_.local_memory_bandwidth : 0;
    result.time = request.link_model == LinkModel::kAstra ? 0 : settings_.base_latency + copy;
    result.closed_form = true;
  } else if (nccl) {
    // NCCL's tuner: the (algorithm, protocol) of least modeled time, timed
    // by the tuner or by the ring pipeline.
    const NcclChoice c = nccl->choose(request.op, request.bytes);
    result.time = nccl->time(request.op, request.bytes, c,
                             settings_.nccl_pipeline ? NcclTimeModel::kPipeline : NcclTimeModel::kTuner);
    result.algorithm = model_algorithm(c.algorithm);
    result.protocol = nccl_protocol_name(c.protocol);
    result.closed_form = true;
  } else {
    Algorithm wanted = request.algorithm == Algorithm::kAuto ? settings_.default_algorithm : request.algorithm;
    const auto& menu = settings_.auto_algorithms.empty() ? concrete_algorithms() : settings_.auto_algorithms;
    std::vector<Algorithm> candidates = wanted == Algorithm::kAuto ? menu : std::vector<Algorithm>{wanted};
    if (request.op == CollectiveOp::kSendRecv) candidates = {Algorithm::kDirect};
    // Branch and bound: cheapest estimate first, so an algorithm that cannot
    // beat a closed form is never simulated. Ties go to the menu's order.
    std::vector<std::pair<Seconds, size_t>> order;
    for (size_t i = 0; i < candidates.size(); ++i) {
      order.emplace_back(candidates.size() > 1 ? in.estimate(candidates[i]) : 0.0, i);
    }
    std::sort(order.begin(), order.end());
    std::string reasons;
    result.time = std::numeric_limits<double>::infinity();
    size_t chosen = candidates.size();
    // `auto` first skips plans too large to simulate cheaply
    // (kAutoSimulationLimit); when that leaves nothing (an all-to-all over a
    // hundred ranks and more), every candidate is timed as if forced.
    for (bool forced : {wanted != Algorithm::kAuto, true}) {
      for (const auto& [estimate, i] : order) {
        Algorithm a = candidates[i];
        std::string why;
        Timed t = in.time_algorithm(a, forced, &why, result.time);
        if (!why.empty() && reasons.find(why) == std::string::npos) reasons += (reasons.empty() ? "" : "; ") + why;
        if (t.time < result.time || (t.time == result.time && i < chosen)) {
          chosen = i;
          result.time = t.time;
          result.algorithm = a;
          result.closed_form = t.closed_form;
          result.transfers = t.transfers;
        }
      }
      if (std::isfinite(result.time) || forced) break;
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

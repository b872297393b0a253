#include "nccl_tuning.h"

#include "nccl_tables.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace zion::sim {
namespace {

using nccl_tables::generation_index;
using nccl_tables::kBaseLatency;
using nccl_tables::kLLMaxBw;
using nccl_tables::kNvlinkLatency;
using nccl_tables::kPerChMaxRingLL128Bw;

// Figures of NCCL v2.21.5 (tag v2.21.5-1), src/graph/tuning.cc and
// src/graph/search.cc. Indices: algorithm Tree, Ring, NVLS, NVLSTree;
// protocol LL, LL128, Simple. Microseconds and GB/s. baseLat, hwLat[NVLINK], llMaxBws and
// the ring LL128 cap, which the pipeline model shares, are in nccl_tables.h;
// the pipeline model itself (launch, time) is nccl_launch.cpp.

constexpr double kPerChMaxTreeLL128Bw[3] = {20.0, 20.0, 36.7};  // perChMaxTreeLL128Bws[gen][0]
constexpr double kPerChMaxTreeBw[3] = {26.5, 24.0, 38.7};       // perChMaxTreeBws[gen][0]

// treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MiB.
constexpr double kTreeCorrection[kNcclProtocols][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

// search.cc: the per-channel bandwidths the channel search tries, without
// NICs in the system (one node), for compute capability < 90 and >= 90.
const std::vector<double> kSpeedsIntra = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0};
const std::vector<double> kSpeedsIntraSm90 = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
constexpr int kMaxRingChannels = 16;  // init.cc: ringGraph.maxChannels = MAXCHANNELS / 2, MAXCHANNELS 32


// How many channels of `speed` fit in `capacity` (NCCL subtracts in steps
// rounded to 1e-3 GB/s; the small slack keeps 240 / 40 at 6).
int channels_fitting(double capacity, double speed) { return static_cast<int>(std::floor(capacity / speed + 1e-9)); }

// ncclTopoDupChannels: a graph of >= 25 GB/s channels doubles its channels
// (up to max_channels) and divides their bandwidth, except on Hopper+ below
// 50 GB/s with more than 4 channels.
NcclGraph duplicate(NcclGraph g, int cc, int max_channels) {
  if (g.bandwidth < 25.0) return g;
  if (cc > 80 && g.bandwidth < 50.0 && g.channels > 4) return g;
  const int dup = std::min(g.channels * 2, max_channels);
  g.bandwidth /= (dup + g.channels - 1) / g.channels;
  g.channels = dup;
  return g;
}

// Pass 2 of ncclTopoCompute: the same channels at a higher speed, where they fit.
NcclGraph raise_speed(NcclGraph g, const std::vector<double>& speeds, double capacity) {
  for (auto it = speeds.rbegin(); it != speeds.rend(); ++it) {
    if (*it > g.bandwidth && g.channels * *it <= capacity + 1e-9) g.bandwidth = *it;
  }
  return g;
}

// The ring search on an NVSwitch: each channel takes `speed` of every GPU's
// link into the switch and out of it. Starting at the highest speed, NCCL
// keeps the graph of most channels x speed (ties: the fewer channels found
// first), stops once that covers the GPU's NVLink bandwidth, and tries lower
// speeds while they are above 0.49 of the best one's.
NcclGraph search_ring(int cc, double capacity) {
  const auto& speeds = cc >= 90 ? kSpeedsIntraSm90 : kSpeedsIntra;
  NcclGraph best;
  size_t i = 0;
  while (i + 1 < speeds.size() && speeds[i] > capacity) ++i;
  for (; i < speeds.size(); ++i) {
    const int ch = std::min(channels_fitting(capacity, speeds[i]), kMaxRingChannels);
    if (ch >= 1 && ch * speeds[i] > best.channels * best.bandwidth) best = {ch, speeds[i]};
    if (best.channels > 0 && best.channels * best.bandwidth >= capacity - 1e-9) break;
    if (i + 1 < speeds.size() && best.channels > 0 && speeds[i + 1] / best.bandwidth <= 0.49) break;
  }
  if (best.channels == 0) throw std::invalid_argument("NCCL channel search: no ring fits " + std::to_string(capacity) + " GB/s of NVLink");
  return raise_speed(duplicate(best, cc, kMaxRingChannels), speeds, capacity);
}

// The tree search takes exactly the ring's channel count (init.cc) and the
// highest speed at which that many chains fit: on one node a tree is a chain,
// each channel taking `speed` of every GPU's link in and out, and the search
// budget is the NVLink bandwidth x ranks / (ranks - 1).
NcclGraph search_tree(int cc, double capacity, int ranks, const NcclGraph& ring) {
  const auto& speeds = cc >= 90 ? kSpeedsIntraSm90 : kSpeedsIntra;
  const double budget = capacity * ranks / (ranks - 1);
  for (double s : speeds) {
    if (s * ring.channels > budget + 1e-9) continue;
    if (ring.channels * s <= capacity + 1e-9) return duplicate({ring.channels, s}, cc, ring.channels);
  }
  throw std::invalid_argument("NCCL channel search: no tree of " + std::to_string(ring.channels) + " channels fits");
}

// NVLS: one channel per GPU (each GPU the head of one); a channel takes
// `speed` of every GPU's link in each direction and twice that of its head's,
// so ranks + 1 speeds per link. The highest speed that fits, starting where
// speed x ranks is within the budget capacity x ranks / (ranks - 1).
// bwInter is then raised (it crosses no link on one node), so the tuner's
// min(bwIntra, bwInter) is bwIntra.
NcclGraph search_nvls(double capacity, int ranks) {
  const double budget = capacity * ranks / (ranks - 1);
  for (double s : kSpeedsIntraSm90) {
    if (s * ranks > budget + 1e-9) continue;
    if (s * (ranks + 1) <= capacity + 1e-9) return {ranks, s};
  }
  return {};
}

constexpr int kMaxChannels = 32;  // src/include/device.h MAXCHANNELS

// --- More than one node ------------------------------------------------------
// tuning.cc, the N1 / N2 / N4 columns (index: 1 node, 2 nodes, more) of the
// per-generation tables, Volta, Ampere, Hopper rows.
constexpr double kPerChMaxRingLL128BwByNodes[3][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}};
constexpr double kPerChMaxTreeLL128BwByNodes[3][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}};
constexpr double kPerChMaxTreeBwByNodes[3][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}};
// llMaxBws across nodes goes by CPU vendor: row 0 Intel (and others), row 1 AMD.
constexpr double kLLMaxBwAcrossNodes[2][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}};
// hwLat[NET]: Tree {5.0, 8.5, 28}, Ring {2.7, 4.0, 14.0}, NVLS {0, 0, 18}
// (unused: NVLS is off across nodes without CollNet), NVLSTree {0, 0, 14}.
constexpr double kNetLatency[kNcclAlgorithms][kNcclProtocols] = {
    {5.0, 8.5, 28}, {2.7, 4.0, 14.0}, {0, 0, 18}, {0, 0, 14}};
// getNetOverhead: the NIC's post overhead per inter-node ring step, x86 Intel
// 1 us, AMD 2 us (other CPUs 1 us); Simple pays it three times.
constexpr double kNetOverheadIntel = 1.0, kNetOverheadAmd = 2.0;

// search.cc: the per-channel speeds tried when the system has NICs.
const std::vector<double> kSpeedsInter = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                          7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
const std::vector<double> kSpeedsInterSm90 = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                              15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};

// Channels of `speed` a node's NICs carry: a channel enters at a NIC and
// leaves by the same NIC (crossNic off in the first passes: the NICs are
// found at PIX distance, so no pass with crossNic is needed), taking `speed`
// of the NIC and of its PCIe path each way, so floor(path / speed) per NIC.
// Each GPU passes a channel on over NVLink except the one it leaves by, so
// a GPU's NVLink carries (ppn - 1) / ppn of channels x speed.
int net_channels_fitting(const NcclTuningInput& in, double speed, int max_channels) {
  const int ppn = in.ranks / in.nodes;
  int ch = std::min(max_channels, in.nics * channels_fitting(in.nic_gb_per_s, speed));
  const double nvlink_share = static_cast<double>(ppn - 1) / ppn;
  while (ch > 0 && ch * speed * nvlink_share > in.nvlink_gb_per_s + 1e-9) --ch;
  return ch;
}

// ncclTopoCompute with NICs, ring pattern. Pass 1 starts at the highest speed
// within the GPU-to-NIC path (system->maxBw) and keeps the graph of most
// channels x speed, stopping once it has MAXCHANNELS / 2 channels or covers
// the GPU's total (NVLink) bandwidth, and trying lower speeds while they are
// above 0.49 of the best one's; then ncclTopoDupChannels; pass 2 tries every
// higher speed with at least as many channels. Ring graphs have bwIntra ==
// bwInter.
NcclGraph search_net_ring(const NcclTuningInput& in) {
  const auto& speeds = in.compute_capability >= 90 ? kSpeedsInterSm90 : kSpeedsInter;
  const double total = in.nvlink_gb_per_s;
  size_t i = 0;
  while (i + 1 < speeds.size() && (speeds[i] > in.nic_gb_per_s || speeds[i] > total)) ++i;
  NcclGraph best;
  for (; i < speeds.size(); ++i) {
    const int ch = net_channels_fitting(in, speeds[i], kMaxRingChannels);
    if (ch >= 1 && ch * speeds[i] > best.channels * best.bandwidth) best = {ch, speeds[i]};
    if (best.channels == kMaxRingChannels) break;
    if (best.channels > 0 && best.channels * best.bandwidth >= total - 1e-9) break;
    if (i + 1 < speeds.size() && best.channels > 0 && speeds[i + 1] / best.bandwidth <= 0.49) break;
  }
  if (best.channels == 0) throw std::invalid_argument("NCCL channel search: no ring fits the NICs");
  best = duplicate(best, in.compute_capability, kMaxRingChannels);
  size_t k = 0;
  while (k + 1 < speeds.size() && speeds[k] > best.bandwidth) ++k;
  NcclGraph raised = best;
  for (size_t j = k; j-- > 0;) {
    const int ch = net_channels_fitting(in, speeds[j], kMaxRingChannels);
    if (ch >= best.channels && ch * speeds[j] > raised.channels * raised.bandwidth) raised = {ch, speeds[j]};
  }
  raised.inter_bandwidth = raised.bandwidth;
  return raised;
}

// ncclTopoCompute with NICs, balanced tree pattern (NET -> GPU a -> ... ->
// GPU x; GPU a and the next GPU each send half back to the NIC): exactly the
// ring's channel count (minChannels = maxChannels), starting where speed x
// channels is within the GPU's bandwidth x ppn / (ppn - 1); the first speed
// at which they fit is final (maxChannels reached). Dup leaves it as is
// (maxChannels). Pass 2 raises bwIntra alone a step at a time, while it is
// below twice bwInter and the chains still fit the NVLinks.
NcclGraph search_net_tree(const NcclTuningInput& in, const NcclGraph& ring) {
  const auto& speeds = in.compute_capability >= 90 ? kSpeedsInterSm90 : kSpeedsInter;
  const int ppn = in.ranks / in.nodes;
  const double budget = in.nvlink_gb_per_s * ppn / (ppn - 1);
  size_t i = 0;
  while (i + 1 < speeds.size() && (speeds[i] > in.nic_gb_per_s || speeds[i] * ring.channels > budget + 1e-9)) ++i;
  for (; i < speeds.size(); ++i) {
    if (net_channels_fitting(in, speeds[i], ring.channels) < ring.channels) continue;
    NcclGraph g{ring.channels, speeds[i], speeds[i]};
    const double nvlink_share = static_cast<double>(ppn - 1) / ppn;
    for (size_t j = i; j-- > 0;) {
      if (!(g.bandwidth < 2 * g.inter_bandwidth)) break;
      if (g.channels * speeds[j] * nvlink_share > in.nvlink_gb_per_s + 1e-9) break;
      g.bandwidth = speeds[j];
    }
    return g;
  }
  throw std::invalid_argument("NCCL channel search: no tree of " + std::to_string(ring.channels) + " channels fits the NICs");
}

// NVLS channels with NICs (ncclTopoSearchRecNet, pattern NVLS): channel c
// takes the c-th NIC (one NIC per channel, so at most nics channels, and at
// most one head per GPU: maxChannels = ngpus) and the GPU local to it as its
// head (ncclTopoGetLocalGpu: each NIC at PIX is local to a GPU of its own),
// bwInter of the GPU-to-NIC path each way, then (ncclTopoSearchTryNvls)
// bwIntra of every GPU's NVLink each way and twice that of the head's. With
// distinct heads, c channels fit while (c + 1) x bwIntra fits the NVLink.
int nvls_net_channels(const NcclTuningInput& in, double intra, double inter) {
  if (inter > in.nic_gb_per_s + 1e-9) return 0;
  const int heads = std::min(in.nics, in.ranks / in.nodes);
  return std::max(0, std::min(heads, channels_fitting(in.nvlink_gb_per_s, intra) - 1));
}

// ncclTopoCompute with NICs, NVLS pattern (minChannels 1, maxChannels ngpus;
// ncclTopoCompareGraphs keeps more channels, or more channels x bwInter).
// Pass 1 starts at the highest speed within the GPU-to-NIC path (and within
// the NVLink x ngpus / (ngpus - 1)) and stops at ngpus channels, or once
// channels x bwInter covers the GPU's NVLink, trying lower speeds while above
// 0.49 of the best one's bwInter. No duplication (ncclTopoDupChannels skips
// NVLS). Pass 2, with the channels fixed, raises bwInter alone a step at a
// time while below twice bwIntra; once the path refuses a bwInter, the
// search's next branch raises bwIntra under that same bwInter, which the path
// still refuses, so bwInter stays at the last speed the path carried.
NcclGraph search_net_nvls(const NcclTuningInput& in) {
  const auto& speeds = kSpeedsInterSm90;
  const int ngpus = in.ranks / in.nodes;
  size_t i = 0;
  const double budget = in.nvlink_gb_per_s * ngpus / (ngpus - 1);
  while (i + 1 < speeds.size() && (speeds[i] > in.nic_gb_per_s || speeds[i] > budget + 1e-9)) ++i;
  NcclGraph best;
  for (; i < speeds.size(); ++i) {
    const int ch = nvls_net_channels(in, speeds[i], speeds[i]);
    if (ch > best.channels || ch * speeds[i] > best.channels * best.inter_bandwidth) best = {ch, speeds[i], speeds[i]};
    if (best.channels == ngpus) break;
    if (best.channels > 0 && best.channels * best.inter_bandwidth >= in.nvlink_gb_per_s - 1e-9) break;
    if (i + 1 < speeds.size() && best.channels > 0 && speeds[i + 1] / best.inter_bandwidth <= 0.49) break;
  }
  if (best.channels == 0) return {};
  size_t k = 0;
  while (k + 1 < speeds.size() && speeds[k] > best.inter_bandwidth) ++k;
  double intra = speeds[k], inter = speeds[k];
  while (k > 0) {
    if (inter == best.inter_bandwidth && inter < 2 * intra) {
      inter = speeds[--k];
    } else if (intra == best.bandwidth && intra < 2 * inter) {
      intra = speeds[--k];
    } else {
      break;
    }
    // The same channels at (intra, inter): kept when they fit and carry more x bwInter.
    if (nvls_net_channels(in, intra, inter) >= best.channels && inter > best.inter_bandwidth) {
      best.bandwidth = intra;
      best.inter_bandwidth = inter;
    }
  }
  return best;
}

int log2_floor(double bytes) {
  long long n = static_cast<long long>(bytes);
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

}  // namespace

const char* nccl_algorithm_name(NcclAlgorithm a) {
  switch (a) {
    case NcclAlgorithm::kTree: return "Tree";
    case NcclAlgorithm::kRing: return "Ring";
    case NcclAlgorithm::kNvls: return "NVLS";
    case NcclAlgorithm::kNvlsTree: return "NVLSTree";
  }
  return "?";
}

std::vector<std::string> nccl_algorithm_names() {
  std::vector<std::string> out;
  for (int a = 0; a < kNcclAlgorithms; ++a) out.emplace_back(nccl_algorithm_name(static_cast<NcclAlgorithm>(a)));
  return out;
}

NcclAlgorithm parse_nccl_algorithm(const std::string& name) {
  std::string allowed;
  for (int a = 0; a < kNcclAlgorithms; ++a) {
    const auto algo = static_cast<NcclAlgorithm>(a);
    if (name == nccl_algorithm_name(algo)) return algo;
    allowed += (a ? ", " : "") + std::string(nccl_algorithm_name(algo));
  }
  throw std::invalid_argument("unknown NCCL algorithm '" + name + "'; allowed: " + allowed);
}

const char* nccl_protocol_name(NcclProtocol p) {
  switch (p) {
    case NcclProtocol::kLL: return "LL";
    case NcclProtocol::kLL128: return "LL128";
    case NcclProtocol::kSimple: return "Simple";
  }
  return "?";
}

Algorithm model_algorithm(NcclAlgorithm a) {
  switch (a) {
    case NcclAlgorithm::kTree: return Algorithm::kDoubleBinaryTree;
    case NcclAlgorithm::kRing: return Algorithm::kRing;
    case NcclAlgorithm::kNvls: return Algorithm::kInSwitch;
    case NcclAlgorithm::kNvlsTree: return Algorithm::kHierarchical;
  }
  return Algorithm::kRing;
}

bool NcclTuning::covers(CollectiveOp op) { return op_index(op) >= 0; }

int NcclTuning::op_index(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kBroadcast: return 0;
    case CollectiveOp::kReduce: return 1;
    case CollectiveOp::kAllGather: return 2;
    case CollectiveOp::kReduceScatter: return 3;
    case CollectiveOp::kAllReduce: return 4;
    default: return -1;
  }
}

NcclTuning::NcclTuning(const NcclTuningInput& in) : input_(in) {
  if (in.compute_capability != 70 && in.compute_capability != 80 && in.compute_capability != 90) {
    throw std::invalid_argument("NCCL tuning: compute capability " + std::to_string(in.compute_capability) +
                                " has no figures; allowed: 70, 80, 90");
  }
  if (in.ranks < 2) throw std::invalid_argument("NCCL tuning: needs at least 2 ranks, got " + std::to_string(in.ranks));
  if (!(in.nvlink_gb_per_s > 0) || !std::isfinite(in.nvlink_gb_per_s)) {
    throw std::invalid_argument("NCCL tuning: NVLink bandwidth per GPU must be a positive number of GB/s");
  }
  if (in.nodes < 1) throw std::invalid_argument("NCCL tuning: nodes must be >= 1, got " + std::to_string(in.nodes));
  if (in.nodes > 1) {
    if (in.ranks % in.nodes != 0 || in.ranks / in.nodes < 2) {
      throw std::invalid_argument("NCCL tuning: " + std::to_string(in.ranks) + " ranks on " + std::to_string(in.nodes) +
                                  " nodes; needs the same number of GPUs on each node, at least 2");
    }
    if (in.nics < 1 || !(in.nic_gb_per_s > 0) || !std::isfinite(in.nic_gb_per_s)) {
      throw std::invalid_argument("NCCL tuning: across nodes needs nics >= 1 and a positive NIC bandwidth in GB/s");
    }
    tune_across_nodes();
    return;
  }
  const int cc = in.compute_capability;
  const int n = in.ranks;
  const int gen = generation_index(cc);
  graphs_[static_cast<int>(NcclAlgorithm::kRing)] = search_ring(cc, in.nvlink_gb_per_s);
  graphs_[static_cast<int>(NcclAlgorithm::kTree)] =
      search_tree(cc, in.nvlink_gb_per_s, n, graphs_[static_cast<int>(NcclAlgorithm::kRing)]);
  // NVLS support, as across nodes: more than 2 GPUs (ncclNvlsInit counts the
  // communicator's GPUs), an NVSwitch and compute capability >= 90.
  if (in.nvls && cc >= 90 && n > 2) graphs_[static_cast<int>(NcclAlgorithm::kNvls)] = search_nvls(in.nvlink_gb_per_s, n);
  graphs_[static_cast<int>(NcclAlgorithm::kNvlsTree)] = graphs_[static_cast<int>(NcclAlgorithm::kNvls)];

  for (CollectiveOp op : {CollectiveOp::kBroadcast, CollectiveOp::kReduce, CollectiveOp::kAllGather,
                          CollectiveOp::kReduceScatter, CollectiveOp::kAllReduce}) {
    const int c = op_index(op);
    const int steps = op == CollectiveOp::kAllReduce ? 2 * (n - 1)
                      : (op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter) ? n - 1
                                                                                              : n;
    for (int a = 0; a < kNcclAlgorithms; ++a) {
      const auto algo = static_cast<NcclAlgorithm>(a);
      // Tree only for all_reduce; NVLS for all_reduce, all_gather and reduce_scatter;
      // NVLSTree needs more than one node (tuning.cc: algoEnable[NVLS_TREE] = 0 when nNodes == 1).
      if (algo == NcclAlgorithm::kNvlsTree) continue;
      if (algo == NcclAlgorithm::kTree && op != CollectiveOp::kAllReduce) continue;
      if (algo == NcclAlgorithm::kNvls && (op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce)) continue;
      const NcclGraph& g = graphs_[a];
      if (g.channels == 0) continue;
      for (int p = 0; p < kNcclProtocols; ++p) {
        const auto proto = static_cast<NcclProtocol>(p);
        if (algo == NcclAlgorithm::kNvls && proto != NcclProtocol::kSimple) continue;
        double bus = g.channels * g.bandwidth;
        if (algo == NcclAlgorithm::kRing && proto == NcclProtocol::kLL) bus = std::min(kLLMaxBw[gen], bus * 0.5);
        if (algo == NcclAlgorithm::kRing && proto == NcclProtocol::kLL128) {
          bus = std::min(bus * 0.92, g.channels * kPerChMaxRingLL128Bw[gen]);  // ppn >= 2 on one node of >= 2 GPUs
        }
        if (algo == NcclAlgorithm::kTree) {
          bus = std::min(bus * 0.92, g.channels * kPerChMaxTreeBw[gen]);
          if (proto == NcclProtocol::kLL) bus = std::min(bus / 3.8, kLLMaxBw[gen]);
          if (proto == NcclProtocol::kLL128) bus = std::min(bus * 7.0 / 9.0, g.channels * kPerChMaxTreeLL128Bw[gen]);
        }
        const double ratio = algo == NcclAlgorithm::kRing   ? static_cast<double>(n) / steps
                             : algo == NcclAlgorithm::kNvls ? 5.0 / 6.0
                                                            : 0.5;
        bandwidth_[c][a][p] = bus * ratio;

        const double hop = kNvlinkLatency[a][p];
        double lat = kBaseLatency[a][p];
        if (algo == NcclAlgorithm::kRing) {
          // Broadcast and reduce on rings that are the same for every channel: one hop.
          lat += (op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce) ? hop : steps * hop;
        } else if (algo == NcclAlgorithm::kTree) {
          lat += 2 * (n - 1) * hop;
        } else {
          lat = hop;  // NVLS: the NVLink latency replaces the base one
        }
        latency_[c][a][p] = lat;
      }
    }
  }
}

// ncclTopoTuneModel for nNodes > 1: Ring and Tree, and NVLSTree for
// all_reduce where NVLS is supported (NVLS itself is off across nodes without
// CollNet: algoEnable[NVLS] = 0 when collNetSupport is 0; CollNet is not
// modeled). LL128 stays enabled: the NICs are at PIX (<= PATH_PXB), the GPUs
// on NVLink, one compute capability.
void NcclTuning::tune_across_nodes() {
  const NcclTuningInput& in = input_;
  const int cc = in.compute_capability;
  const int n = in.ranks;
  const int nodes = in.nodes;
  const int gen = generation_index(cc);
  const int column = nodes <= 2 ? nodes - 1 : 2;  // index2: N2 or N4
  const double ll_max_bw = kLLMaxBwAcrossNodes[in.amd_cpu ? 1 : 0][column];
  const int local = n / nodes;  // nRanks / nNodes
  const double net_overhead = in.amd_cpu ? kNetOverheadAmd : kNetOverheadIntel;
  int log2_nodes = 0;  // log2i(nNodes)
  for (int v = nodes; v >>= 1;) ++log2_nodes;

  const NcclGraph ring = search_net_ring(in);
  graphs_[static_cast<int>(NcclAlgorithm::kRing)] = ring;
  graphs_[static_cast<int>(NcclAlgorithm::kTree)] = search_net_tree(in, ring);
  // NVLS support (src/transport/nvls.cc ncclNvlsInit: more than 2 GPUs in the
  // node; search.cc: an NVSwitch and compute capability >= 90), then the NVLS
  // graph with NICs, which NVLS and NVLSTree share.
  if (in.nvls && cc >= 90 && local > 2) {
    const NcclGraph nvls = search_net_nvls(in);
    graphs_[static_cast<int>(NcclAlgorithm::kNvls)] = nvls;
    graphs_[static_cast<int>(NcclAlgorithm::kNvlsTree)] = nvls;
  }

  for (CollectiveOp op : {CollectiveOp::kBroadcast, CollectiveOp::kReduce, CollectiveOp::kAllGather,
                          CollectiveOp::kReduceScatter, CollectiveOp::kAllReduce}) {
    const int c = op_index(op);
    const bool all_reduce = op == CollectiveOp::kAllReduce;
    const bool gather_scatter = op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter;
    const int steps = all_reduce ? 2 * (n - 1) : gather_scatter ? n - 1 : n;
    const int inter_steps = all_reduce ? 2 * nodes : gather_scatter ? nodes - 1 : nodes;
    for (NcclAlgorithm algo : {NcclAlgorithm::kTree, NcclAlgorithm::kRing}) {
      const int a = static_cast<int>(algo);
      if (algo == NcclAlgorithm::kTree && !all_reduce) continue;
      const NcclGraph& g = graphs_[a];
      // bwIntra up to 2 nodes, bwInter beyond.
      const double per_channel = nodes <= 2 ? g.bandwidth : g.inter_bandwidth;
      for (int p = 0; p < kNcclProtocols; ++p) {
        const auto proto = static_cast<NcclProtocol>(p);
        double bus = g.channels * per_channel;
        if (algo == NcclAlgorithm::kRing && proto == NcclProtocol::kLL) bus = std::min(ll_max_bw, bus * 0.5);
        if (algo == NcclAlgorithm::kRing && proto == NcclProtocol::kLL128) {
          // 0.92 with two or more GPUs per node (NCCL takes 0.7 below 2, which is refused here).
          bus = std::min(bus * 0.92, g.channels * kPerChMaxRingLL128BwByNodes[gen][column]);
        }
        if (algo == NcclAlgorithm::kTree) {
          bus = std::min(bus * 0.92, g.channels * kPerChMaxTreeBwByNodes[gen][column]);
          if (proto == NcclProtocol::kLL) bus = std::min(bus / 3.8, ll_max_bw);
          if (proto == NcclProtocol::kLL128) {
            bus = std::min(bus * 120.0 / 128.0, g.channels * kPerChMaxTreeLL128BwByNodes[gen][column]);
          }
          // The balanced tree pattern: no 0.85 (that is for NCCL_TOPO_PATTERN_TREE).
        }
        bandwidth_[c][a][p] = bus * (algo == NcclAlgorithm::kRing ? static_cast<double>(n) / steps : 0.5);

        // graph->latencyInter is the NIC's reported latency, 0 for InfiniBand
        // (and the Simple flush adds it again): 0 here.
        const double intra = kNvlinkLatency[a][p];
        const double inter = kNetLatency[a][p];
        double lat = kBaseLatency[a][p];
        if (algo == NcclAlgorithm::kRing) {
          if (op == CollectiveOp::kBroadcast || op == CollectiveOp::kReduce) {
            // The search finds the channels with sameChannels = 0 (each NIC
            // starts its own GPU order): nsteps x hwLat[NET], Simple taking
            // the tree's 28 us.
            lat += steps * (proto == NcclProtocol::kSimple ? kNetLatency[0][p] : inter);
          } else {
            const double hop = std::max(intra, proto == NcclProtocol::kSimple ? 3 * net_overhead : net_overhead);
            lat += (steps - inter_steps) * hop + inter_steps * inter;
          }
        } else {
          lat += 2 * ((local - 1) * intra + log2_nodes * inter);
        }
        latency_[c][a][p] = lat;
      }
    }
    // NVLSTree, all_reduce only, Simple only: an NVLS reduce-scatter to the
    // heads, a tree of the heads across nodes, an NVLS all-gather.
    const NcclGraph& nt = graphs_[static_cast<int>(NcclAlgorithm::kNvlsTree)];
    if (all_reduce && nt.channels > 0) {
      const int a = static_cast<int>(NcclAlgorithm::kNvlsTree);
      const int p = static_cast<int>(NcclProtocol::kSimple);
      // min(bwIntra, bwInter up to 2 nodes, bwInter / 2 beyond), x 5/6 to algorithm bandwidth.
      const double per_channel = std::min(nt.bandwidth, nodes <= 2 ? nt.inter_bandwidth : nt.inter_bandwidth / 2);
      bandwidth_[c][a][p] = nt.channels * per_channel * 5.0 / 6.0;
      // baseLat + hwLat[NVLINK] + 2 log2(nNodes) hwLat[NET] (graph->latencyInter 0, as above).
      latency_[c][a][p] = kBaseLatency[a][p] + kNvlinkLatency[a][p] + 2 * log2_nodes * kNetLatency[a][p];
    }
  }
}

double NcclTuning::latency_us(CollectiveOp op, NcclAlgorithm a, NcclProtocol p) const {
  const int c = op_index(op);
  return c < 0 ? 0 : latency_[c][static_cast<int>(a)][static_cast<int>(p)];
}

double NcclTuning::bandwidth_gb_per_s(CollectiveOp op, NcclAlgorithm a, NcclProtocol p) const {
  const int c = op_index(op);
  return c < 0 ? 0 : bandwidth_[c][static_cast<int>(a)][static_cast<int>(p)];
}

std::vector<NcclChoice> NcclTuning::candidates(CollectiveOp op, double bytes) const {
  std::vector<NcclChoice> out;
  const int c = op_index(op);
  if (c < 0) return out;
  const int log_size = log2_floor(std::floor(bytes / 64));
  for (int a = 0; a < kNcclAlgorithms; ++a) {
    for (int p = 0; p < kNcclProtocols; ++p) {
      double bw = bandwidth_[c][a][p];
      if (bw == 0) continue;
      if (static_cast<NcclAlgorithm>(a) == NcclAlgorithm::kTree && log_size < 23) bw *= kTreeCorrection[p][log_size];
      NcclChoice choice;
      choice.algorithm = static_cast<NcclAlgorithm>(a);
      choice.protocol = static_cast<NcclProtocol>(p);
      choice.latency = latency_[c][a][p] * 1e-6;
      // ncclTopoGetAlgoTime: across nodes a Simple ring all_reduce of at
      // least 64 B per channel and rank pays its latency 1.4 times (1.9
      // before Ampere), the ring's plateau.
      if (input_.nodes > 1 && static_cast<NcclAlgorithm>(a) == NcclAlgorithm::kRing &&
          static_cast<NcclProtocol>(p) == NcclProtocol::kSimple && op == CollectiveOp::kAllReduce &&
          std::floor(bytes / (static_cast<double>(collective_channels()) * input_.ranks)) >= 64) {
        choice.latency *= input_.compute_capability < 80 ? 1.9 : 1.4;
      }
      choice.bandwidth = bw * 1e9;
      choice.time = choice.latency + bytes / choice.bandwidth;
      out.push_back(choice);
    }
  }
  return out;
}

int NcclTuning::collective_channels() const {
  // src/graph/connect.cc ncclTopoPostset: the search's channels, min(ring, tree), doubled, up to MAXCHANNELS.
  const int ring = graphs_[static_cast<int>(NcclAlgorithm::kRing)].channels;
  const int tree = graphs_[static_cast<int>(NcclAlgorithm::kTree)].channels;
  return std::min(kMaxChannels, 2 * std::min(ring, tree));
}

NcclChoice NcclTuning::choose(CollectiveOp op, double bytes, const NcclAlgorithm* only) const {
  const NcclChoice* best = nullptr;
  const auto all = candidates(op, bytes);
  for (const auto& c : all) {
    if (only && c.algorithm != *only) continue;
    if (!best || c.time < best->time) best = &c;
  }
  if (!best) {
    throw std::invalid_argument(std::string("NCCL's tuner offers no ") +
                                (only ? std::string(nccl_algorithm_name(*only)) + " " : std::string()) +
                                "algorithm for " + collective_op_name(op) + " here");
  }
  return *best;
}

}  // namespace zion::sim

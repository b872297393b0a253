#pragma once
// Transfers on a topology, with dependencies, timed by one of three link
// models:
//  - kFair: transfers share each link by max-min fair share, recomputed at
//    every arrival and departure (event-driven progressive filling); a
//    transfer ends when its last byte arrives plus the path latency.
//  - kUnaware: each transfer alone on its path: latency + bytes / bottleneck.
//  - kAstra: ASTRA-sim 2.0's analytical backend: per-link FIFO queues,
//    store-and-forward, each hop floor(latency + bytes / bandwidth) ns, an
//    endpoint delay per message and 3 * reduced bytes / local memory
//    bandwidth for the receiver's reduction.

#include <array>
#include <string>
#include <vector>

#include "names.h"
#include "topology.h"

namespace zion::sim {

enum class LinkModel { kFair, kUnaware, kAstra };
inline constexpr std::array<Named<LinkModel>, 3> kLinkModels{{
    {LinkModel::kFair, "fair"},
    {LinkModel::kUnaware, "unaware"},
    {LinkModel::kAstra, "astra"},
}};
const char* link_model_name(LinkModel m);
LinkModel parse_link_model(const std::string& name);  // throws std::invalid_argument naming the allowed
std::vector<std::string> link_model_names();

struct AstraParams {
  Seconds endpoint_delay = 0;
  BytesPerSecond local_memory_bandwidth = 0;  // 0: reductions are free
};

struct Transfer {
  int src = 0;  // vertices
  int dst = 0;
  double bytes = 0;
  double reduce_bytes = 0;  // reduced by the receiver after arrival (kAstra prices it)
  Seconds not_before = 0;   // earliest start, besides the dependencies
  std::vector<int> deps;    // indices of transfers that must end first
};

struct TransferTiming {
  Seconds start = 0;
  Seconds end = 0;
};

struct SimulationResult {
  std::vector<TransferTiming> timings;
  Seconds makespan = 0;
  std::vector<double> link_bytes;  // bytes carried per link id
  int rate_updates = 0;            // fair-share recomputations (work done)
};

SimulationResult simulate(const Topology& topology, const std::vector<Transfer>& transfers, LinkModel link_model,
                          const AstraParams& astra = {});

// ASTRA-sim's time for one message on one link, in whole nanoseconds.
Seconds astra_link_time(const Link& link, double bytes);
Seconds astra_reduction_time(const AstraParams& astra, double bytes);

}  // namespace zion::sim

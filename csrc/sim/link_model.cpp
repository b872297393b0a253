#include "link_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <stdexcept>

namespace zion::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Events closer than this (relative) are simultaneous: floating-point noise
// must not split one step's arrivals into many rate recomputations.
bool reached(double t, double now) { return t <= now + 1e-12 * std::max(1e-9, now); }

using TimedId = std::pair<double, int>;
using MinHeap = std::priority_queue<TimedId, std::vector<TimedId>, std::greater<>>;

// Dependency bookkeeping shared by the three models.
class DependencyGraph {
 public:
  explicit DependencyGraph(const std::vector<Transfer>& transfers)
      : transfers_(transfers), waiting_(transfers.size()), dependents_(transfers.size()), ready_at_(transfers.size(), 0) {
    for (size_t i = 0; i < transfers.size(); ++i) {
      ready_at_[i] = transfers[i].not_before;
      for (int d : transfers[i].deps) {
        if (d < 0 || static_cast<size_t>(d) >= transfers.size() || static_cast<size_t>(d) >= i) {
          throw std::invalid_argument("transfer " + std::to_string(i) + " depends on transfer " + std::to_string(d) +
                                      ", which is not an earlier transfer");
        }
        waiting_[i]++;
        dependents_[d].push_back(static_cast<int>(i));
      }
    }
  }
  // Transfers with no dependencies, with their ready times.
  void seed(MinHeap& ready) const {
    for (size_t i = 0; i < transfers_.size(); ++i) {
      if (waiting_[i] == 0) ready.push({ready_at_[i], static_cast<int>(i)});
    }
  }
  void finished(int id, Seconds end, MinHeap& ready) {
    for (int d : dependents_[id]) {
      ready_at_[d] = std::max(ready_at_[d], end);
      if (--waiting_[d] == 0) ready.push({ready_at_[d], d});
    }
  }

 private:
  const std::vector<Transfer>& transfers_;
  std::vector<int> waiting_;
  std::vector<std::vector<int>> dependents_;
  std::vector<Seconds> ready_at_;
};

struct SubFlow {
  int transfer;
  const Path* path;
  double remaining;
  double rate;
};

class FairShare {
 public:
  FairShare(const Topology& t, const std::vector<Transfer>& transfers, bool share)
      : topology_(t), transfers_(transfers), share_(share), graph_(transfers) {
    result_.timings.resize(transfers.size());
    result_.link_bytes.assign(t.links().size(), 0);
    subs_left_.assign(transfers.size(), 0);
    residual_.assign(t.links().size(), 0);
    users_.assign(t.links().size(), 0);
  }

  SimulationResult run() {
    graph_.seed(ready_);
    Seconds now = 0;
    while (true) {
      double t_next = kInf;
      if (!ready_.empty()) t_next = ready_.top().first;
      if (!arrivals_.empty()) t_next = std::min(t_next, arrivals_.top().first);
      for (const SubFlow& s : active_) {
        if (s.rate > 0) t_next = std::min(t_next, now + s.remaining / s.rate);
      }
      if (t_next == kInf) break;
      t_next = std::max(t_next, now);
      for (SubFlow& s : active_) s.remaining -= s.rate * (t_next - now);
      now = t_next;
      bool changed = finish_injections(now);
      while (!arrivals_.empty() && reached(arrivals_.top().first, now)) {
        int id = arrivals_.top().second;
        arrivals_.pop();
        if (--subs_left_[id] == 0) complete(id, now);
      }
      while (!ready_.empty() && reached(ready_.top().first, now)) {
        int id = ready_.top().second;
        ready_.pop();
        start(id, now);
        changed = true;
      }
      if (changed) assign_rates();
    }
    for (size_t i = 0; i < transfers_.size(); ++i) {
      if (subs_left_[i] != 0 || result_.timings[i].end < result_.timings[i].start) {
        throw std::logic_error("fair-share simulation left transfer " + std::to_string(i) + " unfinished");
      }
    }
    return std::move(result_);
  }

 private:
  void start(int id, Seconds now) {
    const Transfer& tr = transfers_[id];
    result_.timings[id].start = now;
    const Route& route = topology_.route(tr.src, tr.dst);
    double share = tr.bytes / static_cast<double>(route.paths.size());
    subs_left_[id] = static_cast<int>(route.paths.size());
    for (const Path& p : route.paths) {
      for (int l : p.links) result_.link_bytes[l] += share;
      active_.push_back({id, &p, share, 0});
    }
  }

  void complete(int id, Seconds now) {
    result_.timings[id].end = now;
    result_.makespan = std::max(result_.makespan, now);
    graph_.finished(id, now, ready_);
  }

  bool finish_injections(Seconds now) {
    bool any = false;
    for (size_t i = 0; i < active_.size();) {
      SubFlow& s = active_[i];
      double scale = transfers_[s.transfer].bytes;
      bool done = s.remaining <= 1e-9 * scale + 1e-12 ||
                  (s.rate > 0 && reached(now + s.remaining / s.rate, now));
      if (!done) {
        ++i;
        continue;
      }
      arrivals_.push({now + s.path->latency, s.transfer});
      active_[i] = active_.back();
      active_.pop_back();
      any = true;
    }
    return any;
  }

  // Max-min fair rates by progressive filling: repeatedly find the link whose
  // remaining capacity per unfrozen flow is smallest, freeze its flows there.
  void assign_rates() {
    ++result_.rate_updates;
    const auto& links = topology_.links();
    if (!share_) {
      for (SubFlow& s : active_) s.rate = s.path->bottleneck;
      return;
    }
    std::vector<int> touched;
    for (const SubFlow& s : active_) {
      for (int l : s.path->links) {
        if (users_[l]++ == 0) {
          touched.push_back(l);
          residual_[l] = links[l].bandwidth;
        }
      }
    }
    std::vector<char> frozen(active_.size(), 0);
    size_t left = active_.size();
    while (left > 0) {
      int best = -1;
      double best_share = kInf;
      for (int l : touched) {
        if (users_[l] > 0) {
          double share = residual_[l] / users_[l];
          if (share < best_share) best_share = share, best = l;
        }
      }
      if (best < 0) break;
      for (size_t i = 0; i < active_.size(); ++i) {
        if (frozen[i]) continue;
        const auto& pl = active_[i].path->links;
        if (std::find(pl.begin(), pl.end(), best) == pl.end()) continue;
        frozen[i] = 1;
        --left;
        active_[i].rate = best_share;
        for (int l : pl) {
          residual_[l] = std::max(0.0, residual_[l] - best_share);
          --users_[l];
        }
      }
    }
    for (int l : touched) users_[l] = 0;
  }

  const Topology& topology_;
  const std::vector<Transfer>& transfers_;
  bool share_;
  DependencyGraph graph_;
  SimulationResult result_;
  std::vector<SubFlow> active_;
  std::vector<int> subs_left_;
  std::vector<double> residual_;
  std::vector<int> users_;
  MinHeap ready_, arrivals_;
};

SimulationResult run_astra(const Topology& t, const std::vector<Transfer>& transfers, const AstraParams& astra) {
  SimulationResult result;
  result.timings.resize(transfers.size());
  result.link_bytes.assign(t.links().size(), 0);
  std::vector<Seconds> link_free(t.links().size(), 0);
  DependencyGraph graph(transfers);
  MinHeap ready;
  graph.seed(ready);
  while (!ready.empty()) {
    auto [at, id] = ready.top();
    ready.pop();
    const Transfer& tr = transfers[id];
    const Route& route = t.route(tr.src, tr.dst);
    double share = tr.bytes / static_cast<double>(route.paths.size());
    Seconds arrived = at;
    for (const Path& p : route.paths) {
      Seconds clock = at;
      for (int l : p.links) {
        // Store-and-forward: the whole message crosses one link, then the next.
        Seconds begin = std::max(clock, link_free[l]);
        clock = link_free[l] = begin + astra_link_time(t.links()[l], share);
        result.link_bytes[l] += share;
      }
      arrived = std::max(arrived, clock);
    }
    Seconds end = arrived + astra.endpoint_delay + astra_reduction_time(astra, tr.reduce_bytes);
    result.timings[id] = {at, end};
    result.makespan = std::max(result.makespan, end);
    graph.finished(id, end, ready);
  }
  return result;
}

}  // namespace

const char* link_model_name(LinkModel m) { return name_of(kLinkModels, m); }

LinkModel parse_link_model(const std::string& name) { return parse_name(kLinkModels, name, "link model"); }

std::vector<std::string> link_model_names() { return names_of(kLinkModels); }

Seconds astra_link_time(const Link& link, double bytes) {
  double bytes_per_ns = link.bandwidth / kNsPerSecond;
  return from_ns(std::floor(to_ns(link.latency) + bytes / bytes_per_ns + 1e-9));
}

Seconds astra_reduction_time(const AstraParams& astra, double bytes) {
  if (bytes <= 0 || astra.local_memory_bandwidth <= 0) return 0;
  // ASTRA-sim reads two operands and writes the result: 3 memory passes.
  return 3 * from_ns(std::floor(bytes / (astra.local_memory_bandwidth / kNsPerSecond) + 1e-9));
}

SimulationResult simulate(const Topology& topology, const std::vector<Transfer>& transfers, LinkModel link_model,
                          const AstraParams& astra) {
  for (size_t i = 0; i < transfers.size(); ++i) {
    if (!(transfers[i].bytes >= 0) || !std::isfinite(transfers[i].bytes)) {
      throw std::invalid_argument("transfer " + std::to_string(i) + " has " + std::to_string(transfers[i].bytes) +
                                  " bytes; a byte count must be finite and >= 0");
    }
  }
  if (link_model == LinkModel::kAstra) return run_astra(topology, transfers, astra);
  return FairShare(topology, transfers, link_model == LinkModel::kFair).run();
}

}  // namespace zion::sim

#include "collective_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace zion::sim {
namespace {

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); }

// One step alone: every sub-flow (a flow's share of one of its route's
// paths) gets min over its links of bandwidth / sub-flows on that link. When
// all sub-flows get the same rate, have the same size and latency, that is
// exactly the max-min fair allocation and the step lasts latency + size/rate.
std::optional<Seconds> step_time(const PlanStep& step, const Topology& t, LinkModel link_model, const AstraParams& astra,
                                 std::vector<int>& users) {
  struct Sub {
    const Path* path;
    double bytes;
    double reduce;
  };
  std::vector<Sub> subs;
  subs.reserve(step.flows.size());
  for (const PlanFlow& f : step.flows) {
    const Route& r = t.route(f.src, f.dst);
    double share = f.bytes / static_cast<double>(r.paths.size());
    for (const Path& p : r.paths) subs.push_back({&p, share, f.reduce_bytes});
  }
  if (subs.empty()) return 0.0;
  std::vector<int> touched;
  for (const Sub& s : subs) {
    for (int l : s.path->links) {
      if (users[l]++ == 0) touched.push_back(l);
    }
  }
  std::optional<Seconds> result;
  double rate0 = -1, bytes0 = subs[0].bytes, latency0 = subs[0].path->latency, reduce0 = subs[0].reduce;
  bool uniform = true;
  for (const Sub& s : subs) {
    double rate = std::numeric_limits<double>::infinity();
    bool shared = false;
    for (int l : s.path->links) {
      const Link& link = t.links()[l];
      double r = link_model == LinkModel::kFair ? link.bandwidth / users[l] : link.bandwidth;
      rate = std::min(rate, r);
      shared = shared || users[l] > 1;
    }
    if (link_model == LinkModel::kAstra && shared) uniform = false;  // FIFO queueing: simulate
    if (rate0 < 0) rate0 = rate;
    if (!close(rate, rate0) || !close(s.bytes, bytes0) || !close(s.path->latency, latency0) ||
        (link_model == LinkModel::kAstra && !close(s.reduce, reduce0))) {
      uniform = false;
    }
    if (!uniform) break;
  }
  if (uniform) {
    if (link_model == LinkModel::kAstra) {
      // Every sub-flow has its own links; they take the same hop times.
      Seconds worst = 0;
      for (const Sub& s : subs) {
        Seconds tsum = 0;
        for (int l : s.path->links) tsum += astra_link_time(t.links()[l], s.bytes);
        worst = std::max(worst, tsum);
      }
      result = worst + astra.endpoint_delay + astra_reduction_time(astra, reduce0);
    } else {
      result = latency0 + bytes0 / rate0;
    }
  }
  for (int l : touched) users[l] = 0;
  return result;
}

}  // namespace

void append_plan(Plan& into, const Plan& phase) {
  for (const PlanStep& step : phase) into.push_back(step);
}

Plan merge_parallel(const std::vector<Plan>& groups) {
  if (groups.empty()) return {};
  Plan out = groups.front();
  for (size_t g = 1; g < groups.size(); ++g) {
    if (groups[g].size() != out.size()) throw std::logic_error("parallel groups have plans of different shapes");
    for (size_t s = 0; s < out.size(); ++s) {
      if (groups[g][s].repeat != out[s].repeat) throw std::logic_error("parallel groups repeat steps differently");
      const auto& more = groups[g][s].flows;
      if (!more.empty()) out[s].flows.insert(out[s].flows.end(), more.begin(), more.end());
    }
  }
  return out;
}

size_t unrolled_flow_count(const Plan& plan) {
  size_t n = 0;
  for (const PlanStep& s : plan) n += s.flows.size() * static_cast<size_t>(s.repeat);
  return n;
}

std::optional<Seconds> closed_form_time(const Plan& plan, const Topology& t, LinkModel link_model, const AstraParams& astra) {
  // Per-link flow counts, all zero between calls; kept per thread so a
  // query on a large machine does not clear thousands of counters.
  thread_local std::vector<int> users;
  if (users.size() < t.links().size()) users.assign(t.links().size(), 0);
  Seconds total = 0;
  for (const PlanStep& step : plan) {
    auto st = step_time(step, t, link_model, astra, users);
    if (!st) return std::nullopt;
    total += *st * step.repeat;
  }
  return total;
}

namespace {

// Calls visit(step index, flow, path, its share of the flow's bytes, users)
// for every path of every flow of every step, where users[l] is how many
// paths of the step cross link l.
template <class Visit>
void visit_step_paths(const Plan& plan, const Topology& t, Visit&& visit) {
  std::vector<int> users(t.links().size(), 0);
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlanStep& step = plan[i];
    std::vector<int> touched;
    for (const PlanFlow& f : step.flows) {
      for (const Path& p : t.route(f.src, f.dst).paths) {
        for (int l : p.links) {
          if (users[l]++ == 0) touched.push_back(l);
        }
      }
    }
    for (const PlanFlow& f : step.flows) {
      const Route& r = t.route(f.src, f.dst);
      for (const Path& p : r.paths) visit(i, f, p, f.bytes / static_cast<double>(r.paths.size()), users);
    }
    for (int l : touched) users[l] = 0;
  }
}

double path_rate(const Path& p, const Topology& t, LinkModel link_model, const std::vector<int>& users) {
  double rate = std::numeric_limits<double>::infinity();
  for (int l : p.links) rate = std::min(rate, t.links()[l].bandwidth / (link_model == LinkModel::kFair ? users[l] : 1));
  return rate;
}

}  // namespace

Seconds step_synchronous_time(const Plan& plan, const Topology& t, LinkModel link_model, const AstraParams& astra) {
  std::vector<Seconds> worst(plan.size(), 0);
  visit_step_paths(plan, t, [&](size_t i, const PlanFlow& f, const Path& p, double bytes, const std::vector<int>& users) {
    Seconds time = 0;
    if (link_model == LinkModel::kAstra) {
      for (int l : p.links) time += users[l] * astra_link_time(t.links()[l], bytes);
      time += astra.endpoint_delay + astra_reduction_time(astra, f.reduce_bytes);
    } else {
      time = p.latency + bytes / path_rate(p, t, link_model, users);
    }
    worst[i] = std::max(worst[i], time);
  });
  Seconds total = 0;
  for (size_t i = 0; i < plan.size(); ++i) total += worst[i] * plan[i].repeat;
  return total;
}

std::vector<StepLines> step_synchronous_lines(const Plan& plan, const Topology& t, LinkModel link_model, double plan_bytes) {
  if (link_model == LinkModel::kAstra) throw std::invalid_argument("step_synchronous_lines: ASTRA steps are not lines in size");
  std::vector<StepLines> steps(plan.size());
  visit_step_paths(plan, t, [&](size_t i, const PlanFlow&, const Path& p, double bytes, const std::vector<int>& users) {
    steps[i].lines.emplace_back(p.latency, bytes / path_rate(p, t, link_model, users) / plan_bytes);
  });
  for (size_t i = 0; i < plan.size(); ++i) {
    steps[i].repeat = plan[i].repeat;
    // Keep the upper envelope's candidates: by latency, longest first, each
    // line steeper than every line before it.
    auto& lines = steps[i].lines;
    std::sort(lines.begin(), lines.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second > y.second;
    });
    std::vector<std::pair<Seconds, double>> kept;
    for (const auto& line : lines) {
      if (kept.empty() || line.second > kept.back().second) kept.push_back(line);
    }
    lines = std::move(kept);
  }
  return steps;
}

Seconds step_synchronous_time(const std::vector<StepLines>& steps, double bytes) {
  Seconds total = 0;
  for (const StepLines& step : steps) {
    Seconds worst = 0;
    for (const auto& [latency, per_byte] : step.lines) worst = std::max(worst, latency + bytes * per_byte);
    total += worst * step.repeat;
  }
  return total;
}

namespace {

// The transfers of a plan, each waiting for what its sender sent and
// received in the sender's previous step.
std::vector<Transfer> unroll(const Plan& plan, int copies) {
  std::vector<Transfer> flat;
  flat.reserve(unrolled_flow_count(plan) * static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    // For each vertex, the transfers of the last step it took part in.
    std::unordered_map<int, std::vector<int>> last;
    for (const PlanStep& step : plan) {
      for (int r = 0; r < step.repeat; ++r) {
        std::unordered_map<int, std::vector<int>> now;
        for (const PlanFlow& f : step.flows) {
          Transfer tr;
          tr.src = f.src;
          tr.dst = f.dst;
          tr.bytes = f.bytes;
          tr.reduce_bytes = f.reduce_bytes;
          if (auto it = last.find(f.src); it != last.end()) tr.deps = it->second;
          int id = static_cast<int>(flat.size());
          flat.push_back(std::move(tr));
          now[f.src].push_back(id);
          now[f.dst].push_back(id);
        }
        for (auto& [v, ids] : now) last[v] = std::move(ids);
      }
    }
  }
  return flat;
}

}  // namespace

Seconds critical_path_time(const Plan& plan, const Topology& t, bool with_latency) {
  std::vector<Transfer> flat = unroll(plan, 1);
  std::vector<Seconds> end(flat.size(), 0);
  Seconds makespan = 0;
  for (size_t i = 0; i < flat.size(); ++i) {
    Seconds start = 0;
    for (int d : flat[i].deps) start = std::max(start, end[d]);
    const Route& r = t.route(flat[i].src, flat[i].dst);
    Seconds alone = 0;
    for (const Path& p : r.paths) {
      alone = std::max(alone, (with_latency ? p.latency : 0) + flat[i].bytes / static_cast<double>(r.paths.size()) / p.bottleneck);
    }
    end[i] = start + alone;
    makespan = std::max(makespan, end[i]);
  }
  return makespan;
}

Seconds simulate_plan(const Plan& plan, const Topology& t, LinkModel link_model, const AstraParams& astra, int copies,
                      int* transfers) {
  std::vector<Transfer> flat = unroll(plan, copies);
  if (transfers) *transfers = static_cast<int>(flat.size());
  if (flat.empty()) return 0;
  return simulate(t, flat, link_model, astra).makespan;
}

}  // namespace zion::sim

#pragma once
// How one collective request is timed (internal to csrc/sim).
//
// Each algorithm's plan for a rank set is reduced once to a template: a
// closed form time = a + b * bytes when every step is symmetric (time is
// linear in size then), or else a lower bound max(a, b * bytes) that lets
// `auto` skip simulating an algorithm that cannot win. Later queries of
// another size cost a lookup, not a plan.

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collective_plan.h"

namespace zion::sim {

constexpr size_t kResultCacheLimit = 1 << 14;
constexpr size_t kTemplateCacheLimit = 1 << 12;
// `auto` does not simulate a plan of more transfers than this.
constexpr size_t kAutoSimulationLimit = 5000;
// Above this many transfers even a forced algorithm is estimated step by
// step instead of simulated transfer by transfer.
constexpr size_t kSimulationLimit = 200000;
// Level algorithms with more flows per step than this (all pairs among a
// hundred nodes) are not considered by `hierarchical`.
constexpr size_t kLevelFlowLimit = 4096;

struct CollectiveModel::Template {
  std::string not_applicable;
  bool closed_form = false;
  double a = 0, b = 0;
};

struct CollectiveModel::Layout {
  std::string not_applicable;
  std::vector<std::vector<std::vector<int>>> groups;  // [level][group] -> devices
  std::vector<int> level_size;
};

struct Timed {
  Seconds time = std::numeric_limits<double>::infinity();
  bool closed_form = false;
  int transfers = 0;
};

struct CollectiveModel::Internals {
  const CollectiveModel& model;
  const CollectiveRequest& request;
  AstraParams astra;

  // Time of algorithm `a` for the request, or +inf with the reason in `why`.
  // `beat`: the best time so far; an algorithm that cannot beat it is not simulated.
  Timed time_algorithm(Algorithm a, bool forced, std::string* why, Seconds beat) const;
  // Bytes over each link class when `a` runs the request (see CollectiveModel::link_class_bytes).
  std::vector<double> link_class_bytes(Algorithm a) const;

 private:
  PlanContext context(const std::vector<int>& devices, int root) const;
  std::shared_ptr<const Layout> layout(const std::vector<int>& devices) const;
  std::vector<Algorithm> level_choices(const Layout& l, double bytes) const;
  PlanOutcome hierarchical_plan(double bytes, const Layout& l, const std::vector<Algorithm>& choices) const;
  PlanOutcome plan(Algorithm a, double bytes, const std::vector<Algorithm>& choices) const;
  std::shared_ptr<const Template> plan_template(const std::string& key,
                                                const std::function<PlanOutcome(double)>& build) const;
  Timed time_plan(const Plan& plan, bool forced) const;
  Seconds fixed_latency(Algorithm a, const std::vector<Algorithm>& choices = {}) const;
};

}  // namespace zion::sim

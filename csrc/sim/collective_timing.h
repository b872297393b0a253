#pragma once
// How one collective request is timed (internal to csrc/sim).
//
// Each algorithm's plan for a rank set is reduced once to a template: a
// closed form time = a + b * bytes when every step is symmetric (time is
// linear in size then), or else a lower bound max(a, b * bytes) that lets
// `auto` skip simulating an algorithm that cannot win. A plan too large to
// simulate keeps per-step lines of its step-by-step estimate instead. Later
// queries of another size cost a lookup, not a plan.

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
  // Plans too large to simulate are estimated step by step (see
  // step_synchronous_time); when their flows scale with size, these lines
  // give that estimate at any size without planning again.
  bool stepwise = false;
  std::vector<StepLines> steps;
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
  // What `a`'s plan template tells without planning at this size: its time
  // when the template has a closed form, else a lower bound; 0 when there is
  // no template (the astra link model, forced simulation, uneven all_to_all), +inf
  // when `a` does not apply. `auto` prices the candidates in this order, so
  // the closed forms set the bar before anything is simulated.
  Seconds estimate(Algorithm a) const;
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
  // Hierarchical's per-level algorithms at this size (empty for the others);
  // `why` is set when `a` does not apply.
  std::vector<Algorithm> choices_for(Algorithm a, std::string* why) const;
  bool templated() const { return !request.force_simulation && request.all_to_all_bytes.empty(); }
  std::shared_ptr<const Template> template_for(Algorithm a, const std::vector<Algorithm>& choices) const;
  Seconds fixed_latency(Algorithm a, const std::vector<Algorithm>& choices = {}) const;
};

}  // namespace zion::sim

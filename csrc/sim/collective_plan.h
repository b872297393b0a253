#pragma once
// A collective algorithm as a plan: a sequence of steps, each a set of
// point-to-point flows that run at once, possibly repeated. A plan is timed
// either in closed form (when every step is symmetric: all flows the same
// size, latency and fair-share rate, so a step lasts latency + bytes / rate)
// or step by step in the link model, where a rank's flows of one step wait
// for everything that rank sent and received in its previous step.

#include <optional>
#include <string>
#include <vector>

#include "collective.h"

namespace zion::sim {

struct PlanFlow {
  int src;  // vertices
  int dst;
  double bytes;
  double reduce_bytes = 0;  // reduced by the receiver (ASTRA prices it)
};

struct PlanStep {
  std::vector<PlanFlow> flows;
  int repeat = 1;
};

using Plan = std::vector<PlanStep>;

struct PlanContext {
  const Topology& topology;
  std::vector<int> vertices;  // participants, in rank order
  int root = 0;               // index into vertices
  int pipeline_chunks = 1;
  bool bidirectional = true;  // rings run both ways, half the data each
  // The rings the ring algorithm runs at once, each an order of `vertices`
  // that splits the data evenly with the others; empty: one ring in rank
  // order (each hop along its route).
  std::vector<std::vector<int>> rings;
  double in_switch_efficiency = 1.0;
  int fabric_switch = -1;  // vertex of the switch joining all participants, or -1
  const std::vector<std::vector<double>>* all_to_all_bytes = nullptr;
};

// An algorithm that cannot run here says why (e.g. halving-doubling on 6 ranks).
struct PlanOutcome {
  Plan plan;
  std::string not_applicable;  // empty when the plan is valid
};

PlanOutcome build_plan(Algorithm algorithm, CollectiveOp op, double bytes, const PlanContext& ctx);

// As many rings through all of `vertices` as the direct links between them
// allow with no link in two rings (each ring uses both directions of its
// links when run both ways): how NCCL lays its ring channels over an
// NVLink mesh without a switch, where the rank order would route some hops
// through a third GPU. Each ring starts at vertices[0]. Empty when no ring
// of direct links passes through every vertex, or for fewer than 3.
std::vector<std::vector<int>> link_disjoint_rings(const Topology& topology, const std::vector<int>& vertices);

// Concatenates phases; and runs plans of disjoint groups side by side (step i
// of the result holds step i of every group; the groups' plans must have the
// same shape, as they do for equal groups).
void append_plan(Plan& into, const Plan& phase);
Plan merge_parallel(const std::vector<Plan>& groups);

size_t unrolled_flow_count(const Plan& plan);

std::optional<Seconds> closed_form_time(const Plan& plan, const Topology& topology, LinkModel link_model,
                                        const AstraParams& astra);

// An estimate for plans too large to simulate: steps run one after another,
// each as long as its slowest flow at min over its links of bandwidth /
// flows on the link. Exact where closed_form_time applies.
Seconds step_synchronous_time(const Plan& plan, const Topology& topology, LinkModel link_model, const AstraParams& astra);

// The same estimate as a function of size (fair and unaware link models), for a
// plan built at `plan_bytes` whose flows all scale with size: each step
// lasts the longest of its flows' lines latency + bytes * seconds_per_byte.
// Lines another line of the step outlasts at every size are dropped, so a
// step of a million symmetric flows keeps a handful.
struct StepLines {
  int repeat = 1;
  std::vector<std::pair<Seconds, double>> lines;  // (latency, seconds per byte of the collective)
};
std::vector<StepLines> step_synchronous_lines(const Plan& plan, const Topology& topology, LinkModel link_model,
                                              double plan_bytes);
Seconds step_synchronous_time(const std::vector<StepLines>& steps, double bytes);

// A lower bound of the fair and unaware times: the longest chain of
// dependent transfers, each alone on its path. Lets `auto` skip simulating
// an algorithm that cannot beat one already timed. Without latency it bounds
// the size-proportional part alone.
Seconds critical_path_time(const Plan& plan, const Topology& topology, bool with_latency = true);

// `copies` independent instances of the plan run at once (ASTRA's active chunks).
Seconds simulate_plan(const Plan& plan, const Topology& topology, LinkModel link_model, const AstraParams& astra,
                      int copies, int* transfers);

}  // namespace zion::sim

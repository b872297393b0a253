// How fast the hardware model answers: one collective query for 8, 64 and
// 1,024 ranks, and the fair-share simulator's throughput in transfers per
// second. Plain C++ (no Python, no torch): links libzion_sim only.
//
//   cmake -S . -B build/bench -G Ninja -DZION_BUILD_BENCH=ON -DZION_BUILD_PYTHON=OFF
//   cmake --build build/bench --target sim_bench && build/bench/sim_bench

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/collective.h"
#include "sim/platform_loader.h"

using namespace zion::sim;
using Clock = std::chrono::steady_clock;

namespace {

struct Measure {
  double per_call_us;
  CollectiveResult last;
  double first_call_us = 0;  // the model's first query of this rank set and algorithm
};

// Median-free but honest: a warm-up call, then enough calls to fill ~0.3 s.
// Each call asks a size never asked before, so the result cache cannot answer.
Measure time_queries(const CollectiveModel& model, CollectiveRequest r, bool vary_size) {
  double base = r.bytes;
  auto cold = Clock::now();
  model.run(r);  // routes and plan templates computed and cached here, as in any long run
  double first_us = std::chrono::duration<double>(Clock::now() - cold).count() * 1e6;
  int calls = 0;
  auto start = Clock::now();
  double elapsed = 0;
  CollectiveResult last;
  while (elapsed < 0.3) {
    for (int i = 0; i < 16; ++i, ++calls) {
      if (vary_size) r.bytes = base + calls + 1;
      last = model.run(r);
    }
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return {elapsed / calls * 1e6, last, first_us};
}

std::vector<int> first(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

void row(const char* what, int ranks, const char* algo, const Measure& m, const char* target) {
  std::printf("%-44s %6d  %-20s %12.2f %12.1f  %-10s %s\n", what, ranks, algo, m.per_call_us, m.first_call_us,
              m.last.closed_form ? "closed" : (m.last.transfers > 0 ? "simulated" : "estimated"), target);
}

}  // namespace

int main() {
  Platform zion = load_platform("zion");
  Platform zionex8 = load_platform("zionex", {{"nodes", "8"}});
  Platform zionex128 = load_platform("zionex", {{"nodes", "128"}});
  // A fresh model per row, so "first us" is the first query of that rank set.
  auto m8 = [&] { return CollectiveModel(zion); };
  auto m64 = [&] { return CollectiveModel(zionex8); };
  auto m1024 = [&] { return CollectiveModel(zionex128); };

  std::printf("%-44s %6s  %-20s %12s %12s  %-10s %s\n", "query", "ranks", "algorithm", "us/query", "first us", "path",
              "target");
  CollectiveRequest r;
  r.op = CollectiveOp::kAllReduce;
  r.bytes = 64 << 20;

  r.devices = first(8);
  r.algorithm = Algorithm::kRing;
  row("all_reduce, forced ring", 8, "ring", time_queries(m8(), r, true), "<= 10 us");
  r.algorithm = Algorithm::kAuto;
  Measure a8 = time_queries(m8(), r, true);
  row("all_reduce, auto (tries every algorithm)", 8, algorithm_name(a8.last.algorithm), a8, "");
  row("all_reduce, auto, repeated size (cache hit)", 8, algorithm_name(a8.last.algorithm), time_queries(m8(), r, false), "");

  r.devices = first(64);
  r.algorithm = Algorithm::kHierarchical;
  row("all_reduce, hierarchical", 64, "hierarchical", time_queries(m64(), r, true), "");
  r.algorithm = Algorithm::kRing;
  row("all_reduce, forced ring", 64, "ring", time_queries(m64(), r, true), "");

  r.devices = first(1024);
  r.algorithm = Algorithm::kHierarchical;
  row("all_reduce, hierarchical", 1024, "hierarchical", time_queries(m1024(), r, true), "<= 1000 us");
  r.algorithm = Algorithm::kRing;
  row("all_reduce, forced ring", 1024, "ring", time_queries(m1024(), r, true), "<= 1000 us");

  // Step-by-step fair-share simulation of one 8-rank all-to-all step (56 transfers).
  CollectiveRequest a2a;
  a2a.op = CollectiveOp::kAllToAll;
  a2a.bytes = 64 << 20;
  a2a.devices = first(8);
  a2a.algorithm = Algorithm::kDirect;
  a2a.force_simulation = true;
  Measure sim = time_queries(m8(), a2a, true);
  row("all_to_all step, simulated (fair share)", 8, "direct", sim, "<= 100 us");
  std::printf("\nfair-share simulator: %.0f transfers/s (%d transfers per all_to_all step)\n",
              sim.last.transfers / (sim.per_call_us * 1e-6), sim.last.transfers);

  a2a.algorithm = Algorithm::kRing;
  a2a.op = CollectiveOp::kAllReduce;
  Measure ring_sim = time_queries(m8(), a2a, true);
  row("all_reduce ring, simulated (fair share)", 8, "ring", ring_sim, "");
  std::printf("fair-share simulator: %.0f transfers/s (%d transfers per ring all_reduce)\n",
              ring_sim.last.transfers / (ring_sim.per_call_us * 1e-6), ring_sim.last.transfers);
  return 0;
}

// The hardware model's collective pricing for 8, 64 and 1,024 ranks: the
// manual time is the modeled collective time, host_us what one query costs
// the model (each iteration asks a size never asked before, so the result
// cache cannot answer; the routes are built before timing, as sim_bench's
// "first us" shows). Plain C++: links libzion_sim, no torch.
//
//   collective_bench [--benchmark_format=json]

#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "sim/collective.h"
#include "sim/platform_loader.h"

using namespace zion::sim;

namespace {

struct Machine {
  Machine(const char* name, int ranks, Platform p) : name(name), ranks(ranks), platform(std::move(p)), model(platform) {}
  const char* name;
  int ranks;
  Platform platform;
  CollectiveModel model;  // one per machine: routes and plan templates are built once
};

// zion (8 OAMs), zionex with 8 nodes (64) and with 128 nodes (1,024).
std::vector<std::unique_ptr<Machine>>& machines() {
  static std::vector<std::unique_ptr<Machine>> m = [] {
    std::vector<std::unique_ptr<Machine>> v;
    for (auto [name, ranks, preset, nodes] : {std::tuple{"zion", 8, "zion", "1"}, {"zionex_8_nodes", 64, "zionex", "8"},
                                              {"zionex_128_nodes", 1024, "zionex", "128"}}) {
      v.push_back(std::make_unique<Machine>(name, ranks, load_platform(preset, {{"nodes", nodes}})));
    }
    return v;
  }();
  return m;
}

void collective(benchmark::State& state, Machine* machine, CollectiveOp op, Algorithm algorithm) {
  CollectiveRequest r;
  r.op = op;
  r.algorithm = algorithm;
  for (int i = 0; i < machine->ranks; ++i) r.devices.push_back(i);
  double host_s = 0;
  int64_t asked = 0;
  CollectiveResult result;
  for (auto _ : state) {
    r.bytes = static_cast<double>(state.range(0)) + static_cast<double>(++asked);
    auto wall = std::chrono::steady_clock::now();
    result = machine->model.run(r);
    host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    state.SetIterationTime(result.time);
  }
  state.counters["host_us"] = host_s / static_cast<double>(state.iterations()) * 1e6;
  state.counters["busbw_GB/s"] = result.busbw / 1e9;
  state.SetLabel(std::string(algorithm_name(result.algorithm)) +
                 (result.closed_form ? " closed form" : result.transfers ? " simulated" : " estimated"));
}

// Every op with `auto` (which prices each algorithm and takes the fastest)
// and, on the multi-node machines, with hierarchical forced (a closed form).
// all_to_all over 1,024 ranks is left out: its direct plan simulates ~1 M
// transfers per query.
void register_benchmarks() {
  // The first query of a machine builds its routes: done here, outside the timings.
  for (auto& m : machines()) {
    CollectiveRequest warm;
    warm.bytes = 1 << 20;
    for (int i = 0; i < m->ranks; ++i) warm.devices.push_back(i);
    m->model.run(warm);
  }
  for (auto& m : machines()) {
    for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
                            CollectiveOp::kAllToAll}) {
      if (op == CollectiveOp::kAllToAll && m->ranks > 64) continue;
      std::vector<Algorithm> algorithms = {Algorithm::kAuto};
      if (m->ranks > 8 && op != CollectiveOp::kAllToAll) algorithms.push_back(Algorithm::kHierarchical);
      for (Algorithm a : algorithms) {
        std::string name = std::string(collective_op_name(op)) + "/" + m->name + "/ranks:" +
                           std::to_string(m->ranks) + "/" + algorithm_name(a);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), collective, m.get(), op, a);
        b->ArgName("bytes")->Arg(1 << 20)->Arg(64 << 20)->Arg(1 << 30);
        // Iterations vary the size only; a query of `auto` over many ranks takes up to seconds.
        int iterations = m->ranks <= 8 || a != Algorithm::kAuto ? 200 : 2;
        b->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(iterations);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

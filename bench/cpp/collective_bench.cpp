// The hardware model's collective pricing for 8, 64 and 1,024 ranks: the
// manual time is the modeled collective time, host_us what one query costs
// the model (each iteration asks a size never asked before, so the result
// cache cannot answer). Plain C++: links libzion_sim, no torch.
//
//   collective_bench [--benchmark_format=json]

#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "sim/collective.h"
#include "sim/platform_loader.h"

using namespace zion::sim;

namespace {

struct Machine {
  const char* name;
  int ranks;
  Platform platform;
};

// zion (8 OAMs), zionex with 8 nodes (64) and with 128 nodes (1,024).
std::vector<Machine>& machines() {
  static std::vector<Machine> m = {
      {"zion", 8, load_platform("zion")},
      {"zionex_8_nodes", 64, load_platform("zionex", {{"nodes", "8"}})},
      {"zionex_128_nodes", 1024, load_platform("zionex", {{"nodes", "128"}})},
  };
  return m;
}

void collective(benchmark::State& state, const Machine& machine, CollectiveOp op) {
  CollectiveModel model(machine.platform);
  CollectiveRequest r;
  r.op = op;
  r.bytes = static_cast<double>(state.range(0));
  for (int i = 0; i < machine.ranks; ++i) r.devices.push_back(i);
  auto cold = std::chrono::steady_clock::now();
  CollectiveResult result = model.run(r);  // routes and plan templates, built once per rank set
  double first_us = std::chrono::duration<double>(std::chrono::steady_clock::now() - cold).count() * 1e6;
  double host_s = 0;
  int64_t asked = 0;
  for (auto _ : state) {
    r.bytes = static_cast<double>(state.range(0)) + static_cast<double>(++asked);
    auto wall = std::chrono::steady_clock::now();
    result = model.run(r);
    host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    state.SetIterationTime(result.time);
  }
  state.counters["host_us"] = host_s / static_cast<double>(state.iterations()) * 1e6;
  state.counters["first_query_us"] = first_us;
  state.counters["busbw_GB/s"] = result.busbw / 1e9;
  state.SetLabel(std::string(algorithm_name(result.algorithm)) +
                 (result.closed_form ? " closed form" : result.transfers ? " simulated" : " estimated"));
}

void register_benchmarks() {
  for (const auto& m : machines()) {
    for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
                            CollectiveOp::kAllToAll}) {
      std::string name = std::string(collective_op_name(op)) + "/" + m.name + "/ranks:" + std::to_string(m.ranks);
      auto* b = benchmark::RegisterBenchmark(name.c_str(), collective, m, op);
      b->ArgName("bytes")->Arg(1 << 20)->Arg(64 << 20)->Arg(1 << 30);
      b->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(m.ranks >= 1024 ? 20 : 200);
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

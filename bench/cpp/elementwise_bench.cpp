// Elementwise ops and reductions over 64 Ki to 16 Mi fp32 elements: the
// memory-bound side of the roofline (HBM bandwidth times the platform's
// elementwise or reduction efficiency, plus the launch).
//
//   elementwise_bench [--platform=zion] [--benchmark_format=json]

#include <functional>

#include "zion_bench.h"

namespace {

// About 256 MiB of host traffic per benchmark.
constexpr double kHostBytes = 256.0 * (1 << 20);

using Op = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

void elementwise(benchmark::State& state, const Op& op) {
  int64_t n = state.range(0);
  auto options = torch::TensorOptions().device(zion_emu::device(0));
  auto a = torch::rand({n}, options), b = torch::rand({n}, options);
  zion_bench::run_modeled(state, [&] { benchmark::DoNotOptimize(op(a, b)); });
  state.counters["GB/s"] = state.counters["bytes"].value / (state.counters["modeled_us"].value * 1e3);
}

void register_benchmarks() {
  const std::vector<std::pair<const char*, Op>> ops = {
      {"add", [](const torch::Tensor& a, const torch::Tensor& b) { return a + b; }},
      {"mul", [](const torch::Tensor& a, const torch::Tensor& b) { return a * b; }},
      {"relu", [](const torch::Tensor& a, const torch::Tensor&) { return torch::relu(a); }},
      {"sigmoid", [](const torch::Tensor& a, const torch::Tensor&) { return torch::sigmoid(a); }},
      {"sum", [](const torch::Tensor& a, const torch::Tensor&) { return a.sum(); }},
      {"mean", [](const torch::Tensor& a, const torch::Tensor&) { return a.mean(); }},
      {"amax", [](const torch::Tensor& a, const torch::Tensor&) { return a.amax(); }},
      {"softmax_rows_of_1024", [](const torch::Tensor& a, const torch::Tensor&) { return a.view({-1, 1024}).softmax(1); }},
  };
  for (const auto& [name, op] : ops) {
    for (int64_t n : {1 << 16, 1 << 20, 1 << 24}) {
      auto* b = benchmark::RegisterBenchmark(name, elementwise, op);
      b->Arg(n)->ArgName("elements")->UseManualTime()->Unit(benchmark::kMicrosecond);
      b->Iterations(zion_bench::iterations_for(8.0 * n, kHostBytes));
    }
  }
}

}  // namespace

ZION_BENCH_MAIN(register_benchmarks)

// GEMMs of DLRM's MLPs: tall and skinny, a batch of 256 to 4,096 rows
// through the layers of the bottom MLP (13-512-256-128) and the top MLP
// (479-1024-1024-512-256-1), as the MLPerf DLRM reference on Criteo
// Terabyte has them; fp32 and bf16. Each is torch::mm(x [batch, in], w [in, out]).
//
//   gemm_bench [--platform=zion] [--benchmark_filter=bf16] [--benchmark_format=json]

#include "zion_bench.h"

namespace {

struct Layer {
  int64_t in, out;
};
// 512-256 is in both MLPs; it runs once.
const std::vector<Layer> kLayers = {{13, 512}, {512, 256}, {256, 128}, {479, 1024}, {1024, 1024}, {1024, 512}, {256, 1}};
const std::vector<int64_t> kBatches = {256, 1024, 4096};
// About 1 GFLOP of host work per benchmark.
constexpr double kHostFlops = 1e9;

void gemm(benchmark::State& state, torch::ScalarType dtype) {
  int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  auto options = torch::TensorOptions().dtype(dtype).device(zion_emu::device(0));
  auto x = torch::randn({m, k}, options), w = torch::randn({k, n}, options);
  zion_bench::run_modeled(state, [&] { benchmark::DoNotOptimize(torch::mm(x, w)); });
  state.counters["TFLOP/s"] = 2.0 * m * n * k / (state.counters["modeled_us"].value * 1e6);
}

void register_benchmarks() {
  for (auto [dtype, name] : {std::pair{torch::kFloat32, "mm/fp32"}, std::pair{torch::kBFloat16, "mm/bf16"}}) {
    for (const auto& layer : kLayers) {
      for (int64_t batch : kBatches) {
        auto* b = benchmark::RegisterBenchmark(name, gemm, dtype);
        b->Args({batch, layer.in, layer.out})->ArgNames({"m", "k", "n"});
        b->UseManualTime()->Unit(benchmark::kMicrosecond);
        b->Iterations(zion_bench::iterations_for(2.0 * batch * layer.in * layer.out, kHostFlops));
      }
    }
  }
}

}  // namespace

ZION_BENCH_MAIN(register_benchmarks)

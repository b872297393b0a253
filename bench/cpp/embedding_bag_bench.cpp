// EmbeddingBag (sum) as DLRM's sparse features use it: tables of 1e3 to 1e7
// rows, 16 to 128 wide, 1 to 100 lookups per bag, a batch of 2,048 bags.
// Tables over 1 GiB are left out (1e7 rows run at dim 16 only: 640 MB),
// so the benchmark fits the host's memory.
//
//   embedding_bag_bench [--platform=zion] [--benchmark_format=json]

#include "zion_bench.h"

namespace {

constexpr int64_t kBags = 2048;
constexpr double kMaxTableBytes = 1 << 30;
// About 2e8 looked-up floats of host work per benchmark.
constexpr double kHostFloats = 2e8;

const std::vector<int64_t> kPoolings = {1, 10, 100};

// The table, kept from one pooling to the next (a 1e7-row table takes
// seconds to fill) and freed after the last.
torch::Tensor g_table;

torch::Tensor table(int64_t rows, int64_t dim) {
  if (!g_table.defined() || g_table.size(0) != rows || g_table.size(1) != dim) {
    g_table = torch::Tensor();
    g_table = torch::rand({rows, dim}, torch::TensorOptions().device(zion_emu::device(0)));
  }
  return g_table;
}

void embedding_bag(benchmark::State& state) {
  int64_t rows = state.range(0), dim = state.range(1), pooling = state.range(2);
  auto weight = table(rows, dim);
  auto on_device = torch::TensorOptions().dtype(torch::kLong).device(zion_emu::device(0));
  auto indices = torch::randint(rows, {kBags * pooling}, torch::kLong).to(zion_emu::device(0));
  auto offsets = torch::arange(0, kBags * pooling, pooling, on_device);
  zion_bench::run_modeled(state, [&] {
    benchmark::DoNotOptimize(torch::embedding_bag(weight, indices, offsets, false, /*mode=sum*/ 0));
  });
  state.counters["lookups/s"] = kBags * pooling / (state.counters["modeled_us"].value * 1e-6);
  if (pooling == kPoolings.back()) g_table = torch::Tensor();
}

void register_benchmarks() {
  for (int64_t rows : {1000, 100000, 10000000}) {
    for (int64_t dim : {16, 64, 128}) {
      if (4.0 * rows * dim > kMaxTableBytes) continue;
      for (int64_t pooling : kPoolings) {
        auto* b = benchmark::RegisterBenchmark("embedding_bag/sum", embedding_bag);
        b->Args({rows, dim, pooling})->ArgNames({"rows", "dim", "pooling"});
        b->UseManualTime()->Unit(benchmark::kMicrosecond);
        b->Iterations(zion_bench::iterations_for(static_cast<double>(kBags) * pooling * dim, kHostFloats));
      }
    }
  }
}

}  // namespace

ZION_BENCH_MAIN(register_benchmarks)

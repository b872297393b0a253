// Copies: host to device and back (pageable and pinned), and device to
// device over the fabric for every class of OAM pair (pairs from zion:0 whose
// routes have the same hops, bandwidth, latency and link classes).
//
//   copy_bench [--platform=zion] [--set=fabric.topology=ring] [--benchmark_format=json]

#include <map>
#include <tuple>

#include "zion_bench.h"

namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB;
const std::vector<int64_t> kSizes = {4 * kKiB, 1 * kMiB, 16 * kMiB, 256 * kMiB};

torch::Tensor host_bytes(int64_t bytes, bool pinned) {
  auto t = torch::ones({bytes / 4}, torch::kFloat32);
  return pinned ? t.pin_memory() : t;
}

// Host to zion:0 (h2d) or zion:0 to host (d2h); blocking, as tensor.to() is.
void host_copy(benchmark::State& state, bool to_device, bool pinned) {
  int64_t bytes = state.range(0);
  auto host = host_bytes(bytes, pinned);
  auto dev = torch::empty({bytes / 4}, torch::TensorOptions().dtype(torch::kFloat32).device(zion_emu::device(0)));
  zion_bench::run_modeled(state, [&] {
    if (to_device) {
      dev.copy_(host);
    } else {
      host.copy_(dev);
    }
  });
  state.counters["GB/s"] = bytes / (state.counters["modeled_us"].value * 1e3);
}

// zion:0 -> zion:`dst`, on zion:`dst`'s current stream (where the copy is issued).
void device_copy(benchmark::State& state, int dst) {
  int64_t bytes = state.range(0);
  auto src = torch::ones({bytes / 4}, torch::TensorOptions().dtype(torch::kFloat32).device(zion_emu::device(0)));
  auto out = torch::empty({bytes / 4}, torch::TensorOptions().dtype(torch::kFloat32).device(zion_emu::device(dst)));
  // A peer copy runs on the source's stream and counts there; the
  // destination's stream waits for it, so its events time the copy.
  zion_bench::run_modeled(state, [&] { out.copy_(src); }, 0, dst);
  state.counters["GB/s"] = bytes / (state.counters["modeled_us"].value * 1e3);
}

std::string route_name(const zion_emu::OamRoute& r) {
  std::string via;
  for (const auto& c : r.link_classes) via += (via.empty() ? "" : "+") + c;
  return std::to_string(r.hops) + "hop:" + via + (r.paths > 1 ? ":x" + std::to_string(r.paths) : "");
}

void register_benchmarks() {
  for (bool pinned : {false, true}) {
    for (bool to_device : {true, false}) {
      std::string name = std::string(to_device ? "H2D/" : "D2H/") + (pinned ? "pinned" : "pageable");
      auto* b = benchmark::RegisterBenchmark(name.c_str(), host_copy, to_device, pinned);
      b->UseManualTime()->Unit(benchmark::kMicrosecond)->ArgName("bytes");
      for (int64_t s : kSizes) b->Arg(s);
      b->Iterations(4);
    }
  }
  // One benchmark per class of pair, the first destination OAM of the class.
  std::map<std::tuple<int, int, double, double, std::vector<std::string>>, int> classes;
  for (int dst = 1; dst < zion_emu::device_count(); ++dst) {
    auto r = zion_emu::oam_route(0, dst);
    classes.emplace(std::make_tuple(r.hops, r.paths, r.bandwidth_bytes_per_s, r.latency_ns, r.link_classes), dst);
  }
  for (const auto& [key, dst] : classes) {
    std::string name = "D2D/zion:0->zion:" + std::to_string(dst) + "/" + route_name(zion_emu::oam_route(0, dst));
    auto* b = benchmark::RegisterBenchmark(name.c_str(), device_copy, dst);
    b->UseManualTime()->Unit(benchmark::kMicrosecond)->ArgName("bytes");
    for (int64_t s : kSizes) b->Arg(s);
    b->Iterations(4);
  }
}

}  // namespace

ZION_BENCH_MAIN(register_benchmarks)

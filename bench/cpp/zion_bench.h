#pragma once
// What the device microbenchmarks share: the platform flags, and one timed
// iteration. Google Benchmark runs with UseManualTime, the manual time being
// modeled device time between two zion_emu::Events; the host's wall time per
// iteration (what the emulator itself costs) is the counter host_us.
//
// Flags, besides Google Benchmark's own (--benchmark_filter, --benchmark_format=json, ...):
//   --platform=NAME_OR_FILE   a preset ("zion", "zionex", "hgx-h100", ...) or a JSON file
//   --set=path.to.field=VALUE an override, as `python -m zion_emu --set`; repeatable
//
// Each benchmark runs a fixed number of iterations chosen from its size: the
// modeled time is deterministic, so iterations only average the host time
// (and --benchmark_min_time does not apply).

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <zion_emu/zion.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace zion_bench {

// Iterations for work of `units` (FLOPs, bytes, ...) when `units_per_iteration_budget`
// is about what one iteration may cost the host: between 2 and 200.
inline int64_t iterations_for(double units, double budget) {
  return std::clamp<int64_t>(static_cast<int64_t>(budget / std::max(units, 1.0)), 2, 200);
}

// Runs `issue` once per iteration between two events on `stream` (default:
// the current stream of zion:0), waits for the end event, and reports the
// modeled nanoseconds as the iteration's time. Counters: host_us (wall time
// per iteration), and per iteration the device counters' growth on `device`
// (flops, and bytes of ops and copies, as the model charged them) and the
// traffic of each link class that carried any.
template <class Issue>
void run_modeled(benchmark::State& state, Issue&& issue, int device = 0, int stream_device = -1) {
  c10::Stream stream = zion_emu::current_stream(stream_device < 0 ? device : stream_device);
  zion_emu::synchronize();
  auto before = zion_emu::counters(device);
  auto links_before = zion_emu::link_counters();
  double host_s = 0, modeled_s = 0;
  for (auto _ : state) {
    auto wall = std::chrono::steady_clock::now();
    zion_emu::Event start, end;
    start.record(stream);
    issue();
    end.record(stream);
    end.synchronize();
    host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    double s = start.elapsed_ns(end) * 1e-9;
    modeled_s += s;
    state.SetIterationTime(s);
  }
  auto after = zion_emu::counters(device);
  double n = static_cast<double>(state.iterations());
  state.counters["host_us"] = host_s / n * 1e6;
  state.counters["modeled_us"] = modeled_s / n * 1e6;
  state.counters["flops"] = (after.flops - before.flops) / n;
  state.counters["bytes"] = (after.bytes - before.bytes + after.copy_bytes - before.copy_bytes) / n;
  // Per iteration, each link class that carried bytes: <class>_bytes (summed
  // over the class's links crossed) and <class>_busy_us.
  auto links_after = zion_emu::link_counters();
  for (size_t c = 0; c < links_after.size() && c < links_before.size(); ++c) {
    double bytes = links_after[c].bytes - links_before[c].bytes;
    if (bytes <= 0) continue;
    state.counters[links_after[c].name + "_bytes"] = bytes / n;
    state.counters[links_after[c].name + "_busy_us"] = (links_after[c].busy_ns - links_before[c].busy_ns) / n / 1e3;
  }
}

struct PlatformChoice {
  std::string name = "";
  std::vector<std::pair<std::string, std::string>> overrides;
};

// Reads --platform and --set, leaving argv with what is left; exits with a
// message naming an argument neither it nor Google Benchmark knows.
inline PlatformChoice parse_platform_flags(int* argc, char** argv) {
  PlatformChoice choice;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--platform=", 11) == 0) {
      choice.name = a + 11;
    } else if (std::strncmp(a, "--set=", 6) == 0) {
      std::string assignment = a + 6;
      auto eq = assignment.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "error: --set=%s must look like --set=path.to.field=value (e.g. --set=oam.count=4)\n",
                     assignment.c_str());
        std::exit(2);
      }
      choice.overrides.emplace_back(assignment.substr(0, eq), assignment.substr(eq + 1));
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return choice;
}

// main(): flags, platform, then `register_benchmarks` (which may depend on
// the platform, e.g. its OAM pairs), then the run.
inline int bench_main(int argc, char** argv, void (*register_benchmarks)()) {
  zion_emu::init();
  PlatformChoice choice = parse_platform_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  try {
    if (!choice.name.empty() || !choice.overrides.empty()) {
      zion_emu::set_platform(choice.name.empty() ? "zion" : choice.name, choice.overrides);
    }
    benchmark::AddCustomContext("zion_platform", zion_emu::platform_name());
    register_benchmarks();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace zion_bench

#define ZION_BENCH_MAIN(register_benchmarks) \
  int main(int argc, char** argv) { return zion_bench::bench_main(argc, argv, register_benchmarks); }

// Times one GEMM on zion:0 of a chosen platform with modeled events.
//   gemm_timing [platform] [m n k]     e.g. gemm_timing hgx-h100 4096 1024 1024
#include <torch/torch.h>
#include <zion_emu/zion.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  zion_emu::set_platform(argc > 1 ? argv[1] : "zion");
  int64_t m = argc > 4 ? std::stoll(argv[2]) : 2048, n = argc > 4 ? std::stoll(argv[3]) : 1024,
          k = argc > 4 ? std::stoll(argv[4]) : 1024;
  torch::Device dev("zion:0");
  auto a = torch::randn({m, k}, dev), b = torch::randn({k, n}, dev);
  zion_emu::synchronize();
  zion_emu::Event start, end;
  start.record();
  auto c = torch::matmul(a, b);
  end.record();
  end.synchronize();
  double ns = start.elapsed_ns(end);
  std::printf("%s zion:0 matmul %lldx%lldx%lld fp32: %.3f ns modeled, %.2f TFLOP/s\n", zion_emu::platform_name().c_str(),
              (long long)m, (long long)n, (long long)k, ns, 2.0 * m * n * k / ns / 1e3);
  auto mem = zion_emu::memory_stats(0);
  std::printf("zion:0 memory: %lld bytes allocated, peak %lld\n", (long long)mem.allocated_bytes,
              (long long)mem.peak_allocated_bytes);
}

// Autocast for zion: `torch.autocast("zion", dtype=...)` casts the same ops
// CUDA's autocast casts, with the same policies, using the op lists ATen
// shares between backends (ATen/autocast_mode.h). The casts themselves are
// ordinary zion ops, so they are priced like any other.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace zion::device {
namespace {

// The shared op lists spell signatures as ATen's own code does.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast (as on CUDA).\n"
              "Combine the sigmoid before it and the loss into torch.nn.functional.binary_cross_entropy_with_logits "
              "or torch.nn.BCEWithLogitsLoss, which are safe to autocast.");
}

// Ops outside the lists run in the dtype they are given.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define ZION_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define ZION_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define ZION_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define ZION_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(ZION_LOWER_PRECISION_FP)
  AT_FORALL_FP32(ZION_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(ZION_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(ZION_PROMOTE)
#undef ZION_LOWER_PRECISION_FP
#undef ZION_FP32
#undef ZION_FP32_SET_OPT_DTYPE
#undef ZION_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
}

}  // namespace
}  // namespace zion::device

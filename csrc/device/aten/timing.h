#pragma once
// Timing-only mode (ZION_MODE=timing, read once, before the first zion
// tensor). Floating-point zion tensors are storage-less: their pool accounts
// their bytes exactly as in real mode, and no host memory backs them.
// Integer and bool tensors stay real (up to kRealIntegerLimitBytes each), so
// indices, offsets, lengths and masks, and everything computed from them
// alone, have their real values.
//
// An op that reads a storage-less tensor runs its Meta kernel on meta aliases
// of its arguments (the embedding-bag family runs its CPU kernel on narrow
// zero stand-ins, so its integer results are real); its fresh results are
// storage-less zion tensors, and it is priced exactly as in real mode, from
// the same shapes and dtypes. The host reading a storage-less value gets a
// placeholder (0, 0.0, false), counted per call site for the report.

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace zion::device {

// Integer and bool zion tensors up to this size stay real in timing-only
// mode; larger ones are storage-less (their values are then unknown).
constexpr size_t kRealIntegerLimitBytes = size_t{256} << 20;

// Whether a zion tensor (dense or sparse COO) has storage-less bytes.
bool is_storage_less(const at::Tensor& t);
// In timing-only mode: whether a new tensor of this dtype and size has host bytes.
bool stays_real(c10::ScalarType dtype, size_t nbytes);
// A fresh storage-less zion tensor (contiguous) on `device`.
at::Tensor empty_storage_less(c10::IntArrayRef size, c10::ScalarType dtype, c10::DeviceIndex device);

// The storage-less counterpart of a CPU kernel's result computed on stand-ins
// whose last dimension `d` was narrowed to `width`: `d` put back, over a
// storage as large as the CPU result's (scaled likewise), on `device`.
at::Tensor storage_less_result(const at::Tensor& cpu, int64_t d, int64_t width, c10::DeviceIndex device);
// Whether a dense tensor's elements are all of its storage's bytes.
bool covers_storage(const at::Tensor& t);
// Gives a real zion tensor's storage back and makes it storage-less (same
// size, same pool): its values are overwritten by unknown ones.
void make_storage_less(const at::Tensor& t);

// Whether any argument on the stack is a storage-less zion tensor (false in real mode).
bool has_storage_less_argument(const c10::OperatorHandle& op, const torch::jit::Stack* stack);
// Runs and prices the op without host bytes (see above).
void timing_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The error for an op the CPU has no kernel for (CUDA-only ops), in either mode.
[[noreturn]] void refuse_op_without_cpu_kernel(const c10::OperatorName& name);

// The embedding-bag family (timing_embedding_bag.cpp): _embedding_bag and its
// backward ops, whose integer results timing-only mode computes for real.
bool is_embedding_bag_family(const std::string& name);
void embedding_bag_without_bytes(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The host reads a storage-less value: counts the read and returns a placeholder.
at::Scalar placeholder_scalar(const at::Tensor& t, const char* what);
// Counts a read of a storage-less tensor's values (warns once per call site).
void record_placeholder_read(const at::Tensor& t, const char* what);

struct PlaceholderRead {
  std::string site;  // the script's file:line, if known
  std::string what;  // how it was read (item(), a copy to host memory)
  std::string dtype;
  int64_t count;
};
std::vector<PlaceholderRead> placeholder_reads();
void reset_placeholder_reads();
// Installs the function that names the caller's source line (the Python bindings do).
void set_call_site_reader(std::string (*reader)());

}  // namespace zion::device

// Convolution on zion. ATen's convolution picks a backend by device; for a
// device it does not know it calls convolution_overrideable (and, backward,
// convolution_backward_overrideable), whose default kernels only raise. These
// run ATen's CPU convolution on zero-copy aliases instead, so zion's
// numerics are CPU's, and price the op like any other.

#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <vector>

#include "device/runtime/allocator.h"
#include "device/aten/op_pricing.h"
#include "device/runtime/runtime.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"

namespace zion::device {
namespace {

c10::OperatorHandle operator_named(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// Timing-only mode: a convolution over storage-less tensors runs ATen's
// convolution on meta tensors of the same sizes, strides and dtypes, which
// gives its results' layout; they are made storage-less on the device and
// priced from the same shapes as in real mode.
bool any_storage_less(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (t && t->defined() && is_storage_less(*t)) return true;
  }
  return false;
}

at::Tensor meta_like(const at::Tensor& t) {
  return t.defined() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)) : t;
}

// The layout the CPU's kernels give a convolution's results: channels-last
// when the input or the weight is (mkldnn_conv_use_channels_last and
// thnn_conv_use_channels_last), where the meta kernel gives a contiguous one.
at::MemoryFormat cpu_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  for (const at::Tensor* t : {&input, &weight}) {
    const at::MemoryFormat f = t->suggest_memory_format();
    if (f == at::MemoryFormat::ChannelsLast || f == at::MemoryFormat::ChannelsLast3d) return f;
  }
  return at::MemoryFormat::Contiguous;
}

at::Tensor storage_less_like(const at::Tensor& meta, c10::DeviceIndex device,
                             at::MemoryFormat format = at::MemoryFormat::Preserve) {
  if (!meta.defined()) return meta;
  if (format != at::MemoryFormat::Preserve && meta.dim() == (format == at::MemoryFormat::ChannelsLast3d ? 5 : 4)) {
    return storage_less_like(meta.contiguous(format), device);
  }
  at::Tensor z = empty_storage_less({meta.storage().nbytes() / meta.element_size()}, meta.scalar_type(), device);
  return z.as_strided(meta.sizes(), meta.strides(), meta.storage_offset());
}

// As the fallback and CUDA refuse them: every tensor on the input's device.
// The input's device is then made current, as the fallback makes it.
c10::DeviceGuard on_one_device(const char* name, const at::Tensor& input, std::initializer_list<const at::Tensor*> others) {
  for (const at::Tensor* t : others) {
    if (t && t->defined() && t->device() != input.device()) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  input.device(), " and ", t->device(), "! (when checking arguments for ", name, ")");
    }
  }
  return c10::DeviceGuard(input.device());
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  static const c10::OperatorHandle op = operator_named("aten::convolution_overrideable");
  c10::DeviceGuard guard =
      on_one_device("convolution_overrideable", input, {&weight, bias ? &*bias : nullptr});
  const int64_t int_args[] = {transposed ? 1 : 0};  // a transposed convolution is counted over its input's positions
  if (any_storage_less({&input, &weight, bias ? &*bias : nullptr})) {
    std::optional<at::Tensor> meta_bias;
    if (bias && bias->defined()) meta_bias = meta_like(*bias);
    at::Tensor meta = at::convolution(meta_like(input), meta_like(weight), meta_bias, stride, padding, dilation,
                                      transposed, output_padding, groups);
    std::vector<at::Tensor> inputs{input, weight};
    if (bias && bias->defined()) inputs.push_back(*bias);
    std::vector<at::Tensor> outputs{storage_less_like(meta, input.device().index(), cpu_memory_format(input, weight))};
    charge_op(op, input.device().index(), inputs, outputs, int_args);
    return outputs[0];
  }
  AliasSet aliases(input.device().index());
  std::vector<at::Tensor> inputs{aliases.alias(input), aliases.alias(weight)};
  std::optional<at::Tensor> cpu_bias;
  if (bias && bias->defined()) {
    cpu_bias = aliases.alias(*bias);
    inputs.push_back(*cpu_bias);
  }
  KernelHostMemory::Scope kernel_memory;
  at::Tensor out = at::convolution(inputs[0], inputs[1], cpu_bias, stride, padding, dilation, transposed,
                                   output_padding, groups);
  std::vector<at::Tensor> outputs{aliases.to_zion(out)};
  charge_op(op, input.device().index(), inputs, outputs, int_args);
  return outputs[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  static const c10::OperatorHandle op = operator_named("aten::convolution_backward_overrideable");
  c10::DeviceGuard guard = on_one_device("convolution_backward_overrideable", input, {&grad_output, &weight});
  // The bias gradient sums grad_output over all but the channel dimension.
  const int64_t bias_size = grad_output.size(1);
  // Which gradients were asked for decides how many convolutions run.
  const int64_t int_args[] = {transposed ? 1 : 0, output_mask[0] ? 1 : 0, output_mask[1] ? 1 : 0,
                              output_mask[2] ? 1 : 0};
  if (any_storage_less({&grad_output, &input, &weight})) {
    auto [gi, gw, gb] = at::convolution_backward(meta_like(grad_output), meta_like(input), meta_like(weight),
                                                 c10::IntArrayRef(bias_size), stride, padding, dilation, transposed,
                                                 output_padding, groups, output_mask);
    const c10::DeviceIndex device = input.device().index();
    std::vector<at::Tensor> inputs{grad_output, input, weight};
    const at::MemoryFormat format = cpu_memory_format(input, weight);
    std::vector<at::Tensor> outputs{storage_less_like(gi, device, format), storage_less_like(gw, device, format),
                                    storage_less_like(gb, device)};
    charge_op(op, device, inputs, outputs, int_args);
    return {outputs[0], outputs[1], outputs[2]};
  }
  AliasSet aliases(input.device().index());
  std::vector<at::Tensor> inputs{aliases.alias(grad_output), aliases.alias(input), aliases.alias(weight)};
  KernelHostMemory::Scope kernel_memory;
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(inputs[0], inputs[1], inputs[2], c10::IntArrayRef(bias_size), stride, padding,
                               dilation, transposed, output_padding, groups, output_mask);
  std::vector<at::Tensor> outputs{aliases.to_zion(grad_input), aliases.to_zion(grad_weight),
                                  aliases.to_zion(grad_bias)};
  charge_op(op, input.device().index(), inputs, outputs, int_args);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", &convolution_overrideable);
  m.impl("convolution_backward_overrideable", &convolution_backward_overrideable);
}

}  // namespace zion::device

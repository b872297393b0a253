#pragma once
// Charges an op run on zion to the virtual timeline: the hardware model
// prices it from its operator and tensor shapes.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include "sim/op_cost.h"

#include <optional>
#include <string>
#include <vector>


namespace zion::device {

// `inputs` and `outputs` are the op's tensors (zion or their CPU aliases);
// `int_args` the non-tensor arguments its formula reads (op_formulas.cpp
// documents them per formula, e.g. `transposed` of a convolution). The
// operator's name and formula are looked up once per operator and cached;
// the call itself allocates nothing in steady state. Each thread remembers
// the prices of each operator by the shapes they stand for (a step calls one
// operator on many shapes, one per layer or parameter, up to 1024 kept): a
// call with the same dtypes, sizes and int_args, under the same platform,
// formula table and (for matmul-class ops and convolutions) precision
// settings, is charged that price without running the formula again. A
// registered formula runs on every call.
void charge_op(const c10::OperatorHandle& op, c10::DeviceIndex device, c10::ArrayRef<at::Tensor> inputs,
               c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<int64_t> int_args = {});
void charge_op(const std::string& op_name, c10::DeviceIndex device, c10::ArrayRef<at::Tensor> inputs,
               c10::ArrayRef<at::Tensor> outputs);
// Ops priced so far by this process (all threads and devices).
int64_t priced_ops();
// Of those, the ones whose price was worked out by a formula, not remembered.
int64_t formula_runs();

// Charges one kernel that torch.compile generated (a fused loop nest that
// runs as one C++ function on the tensors' host memory): the roofline prices
// its FLOPs at `dtype`'s peak and the bytes it reads and writes at the memory
// efficiency of `op_class`, as for an op, plus one launch overhead, on the
// device's current stream. `label` names it on the timeline. It counts as an
// op and as a compiled kernel. Throws std::invalid_argument naming `label`
// if a count is negative or not finite.
// The last float32 matmul-class op or convolution charged in this process:
// its operator, the precision its settings asked for (fp32, tf32 or bf16) and
// the one whose peak priced it (fp32 where the platform has no peak for the
// asked one). None before the first.
struct Fp32MatmulPricing {
  std::string op;
  sim::DType requested;
  sim::DType priced;
};
std::optional<Fp32MatmulPricing> last_fp32_matmul_pricing();

// Every float32 matmul-class op and convolution charged in this process, by
// (requested, priced) precision: how many, their FLOPs and their modeled
// device seconds. In order of the precisions' first use.
struct Fp32MatmulCount {
  sim::DType requested;
  sim::DType priced;
  int64_t ops = 0;
  double flops = 0;
  double device_s = 0;
};
std::vector<Fp32MatmulCount> fp32_matmul_counts();

void charge_kernel(c10::DeviceIndex device, const std::string& label, double flops, double bytes,
                   sim::OpClass op_class, sim::DType dtype);

}  // namespace zion::device

#pragma once
// Charges an op run on zion to the virtual timeline: the hardware model
// prices it from its operator name and tensor shapes.

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace zion::device {

// `inputs` and `outputs` are the op's tensors (zion or their CPU aliases).
void charge_op(const std::string& op_name, c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs);

}  // namespace zion::device

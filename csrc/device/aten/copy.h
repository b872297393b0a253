#pragma once
// Copies between the host and zion devices, and between zion devices. The
// bytes move with memcpy on host memory; the time is a transfer in the link
// model on the current stream (D2D over the accelerator fabric, H2D/D2H over
// PCIe and, from a socket other than the OAM's, UPI). Pageable host memory
// costs the host a staging copy at DDR bandwidth first.

#include <ATen/Tensor.h>

#include <vector>

#include "sim/units.h"

namespace zion::device {

void copy_between(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

// When each link of the node becomes free of the copies queued on it (by
// link id of the topology): part of a checkpoint, with the timeline.
std::vector<sim::Seconds> link_free_times();
void restore_link_free_times(const std::vector<sim::Seconds>& free_at);

}  // namespace zion::device

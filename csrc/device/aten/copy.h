#pragma once
// Copies between the host and zion devices, and between zion devices. The
// bytes move with memcpy on host memory; the time is a transfer over the
// route of the topology (D2D over the accelerator fabric, or PCIe where the
// fabric has no path; H2D/D2H over PCIe and, from a socket other than the
// OAM's, UPI). Pageable host memory costs the host a staging copy at DDR
// bandwidth first.
//
// Two ways a link carries copies:
//  - copy_between (one copy, from copy_): copies issued independently cross
//    a link one after another (FIFO), each at the route's full bandwidth.
//  - copy_batch: copies issued at once share their links by the link model's
//    max-min fair share, as the transfers of one collective do.

#include <ATen/Tensor.h>

#include <vector>

#include "sim/units.h"

namespace zion::device {

// H2D and D2H run on the device's current stream. D2D runs as CUDA's peer
// copy: on the source's current stream, after the destination's current
// stream, which then waits for it; its bytes count on the source device.
void copy_between(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);
// The time of a copy between host memory on socket `socket_index` (pinned
// or pageable) and device `device`, as copy_between prices it, without
// moving bytes: timing-only tensors in a socket's DDR (zion_emu/socket_tensor.py).
void price_host_copy(int device, int socket_index, bool pinned, double bytes, bool to_zion, bool non_blocking);

// Copies srcs[i] into dsts[i] (zion tensors, same shape and dtype), issued
// at once: copy i lands on stream streams[i] of its destination device (the
// destination's current stream when streams is empty or streams[i] < 0),
// no earlier than the host has issued it, that stream and the source's
// current stream are ready, and the FIFO copies before it have left its
// links; the batch then shares links by max-min fair share (sim::simulate,
// LinkModel::kFair), and later single copies queue behind it. The copies
// landing on one stream are one piece of work there, as a grouped NCCL
// kernel is: side by side, the stream done when the last is. Bytes count on
// the destination device.
void copy_batch(at::TensorList srcs, at::TensorList dsts, c10::IntArrayRef streams);

// When each link of the node becomes free of the copies queued on it (by
// link id of the topology): part of a checkpoint, with the timeline.
std::vector<sim::Seconds> link_free_times();
void restore_link_free_times(const std::vector<sim::Seconds>& free_at);

}  // namespace zion::device

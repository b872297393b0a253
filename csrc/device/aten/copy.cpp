#include "device/aten/copy.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
#include "device/aten/tensor_alias.h"
#include "sim/platform_topology.h"

namespace zion::device {
namespace {

// Copies occupy the links of their route one after another (FIFO), so two
// copies over one link on two streams take twice as long as one.
struct LinkOccupancy {
  std::mutex mutex;
  std::vector<sim::Seconds> free_at;
};

LinkOccupancy& links() {
  static LinkOccupancy instance;
  return instance;
}

// The span label of a kind of copy: "copy H2D", "copy D2H", "copy D2D".
int copy_label(Runtime& rt, const char* kind) { return rt.timeline.label(std::string("copy ") + kind); }

// Issues a transfer from vertex `src` to vertex `dst` on (device, stream).
// The bytes split evenly over the route's equal-cost paths.
void transfer(Runtime& rt, int device, int stream, int src, int dst, double bytes, int label) {
  const sim::Route& route = rt.topology.route(src, dst);
  const auto& all_links = rt.topology.links();
  LinkOccupancy& occ = links();
  std::lock_guard<std::mutex> lock(occ.mutex);
  if (occ.free_at.size() != all_links.size()) occ.free_at.assign(all_links.size(), 0);
  sim::Seconds ready = 0;
  for (const auto& path : route.paths) {
    for (int l : path.links) ready = std::max(ready, occ.free_at[l]);
  }
  sim::Seconds busy = bytes / route.bandwidth;
  uint32_t classes = 0;
  for (const auto& path : route.paths) {
    for (int l : path.links) classes |= all_links[l].link_class < 32 ? 1u << all_links[l].link_class : 0u;
  }
  sim::Interval in = rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, route.latency + busy, ready,
                                        sim::Activity::kCopy, label, classes);
  double per_path = bytes / static_cast<double>(route.paths.size());
  for (const auto& path : route.paths) {
    for (int l : path.links) {
      occ.free_at[l] = in.start + busy;
      rt.timeline.count_link(all_links[l].link_class, per_path, per_path / all_links[l].bandwidth);
    }
  }
}

}  // namespace

std::vector<sim::Seconds> link_free_times() {
  LinkOccupancy& occ = links();
  std::lock_guard<std::mutex> lock(occ.mutex);
  return occ.free_at;
}

void restore_link_free_times(const std::vector<sim::Seconds>& free_at) {
  LinkOccupancy& occ = links();
  std::lock_guard<std::mutex> lock(occ.mutex);
  occ.free_at = free_at;  // an empty or foreign-sized vector is reset to zeros by the next transfer
}

void copy_between(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  at::Tensor s = src.device().is_privateuseone() ? cpu_alias(src) : src;
  at::Tensor d = dst.device().is_privateuseone() ? cpu_alias(dst) : dst;
  d.copy_(s, non_blocking);

  Runtime& rt = runtime();
  double bytes = static_cast<double>(dst.numel()) * static_cast<double>(dst.element_size());
  bool from_zion = src.device().is_privateuseone(), to_zion = dst.device().is_privateuseone();
  int device = to_zion ? dst.device().index() : src.device().index();
  int stream = static_cast<int>(current_stream(device).id());
  if (from_zion && to_zion) {
    int a = src.device().index(), b = dst.device().index();
    if (a == b) {
      // Within one device: HBM read and write.
      rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, 2 * bytes / rt.platform.oam.hbm_bandwidth, 0,
                         sim::Activity::kCopy, copy_label(rt, "D2D"));
    } else {
      transfer(rt, device, stream, sim::device_vertex(rt.topology, rt.platform, a),
               sim::device_vertex(rt.topology, rt.platform, b), bytes, copy_label(rt, "D2D"));
    }
    rt.timeline.count_copy(device, bytes);
    return;
  }
  const at::Tensor& host = to_zion ? src : dst;
  // The host side is the socket whose DDR holds the tensor (pinned memory,
  // or memory placed by zion_emu.socket(i)); other memory counts as the
  // device's home socket's. The route from there crosses UPI when that
  // socket is not the one the OAM's PCIe switch hangs off.
  const void* host_ptr = host.numel() ? host.const_data_ptr() : nullptr;
  int placed_socket = pinned_allocator().socket_of(host_ptr);
  bool pinned = placed_socket >= 0 && pinned_allocator().is_pinned(host_ptr);
  int socket_index = placed_socket >= 0 ? placed_socket : home_socket(rt.platform, device);
  int oam = sim::device_vertex(rt.topology, rt.platform, device);
  int socket = rt.topology.find(sim::VertexKind::kSocket, 0, socket_index);
  // Pageable memory goes through a pinned staging buffer, copied by the host
  // at DDR bandwidth; the copy is then synchronous, as CUDA makes it.
  sim::Seconds staging = pinned ? 0 : bytes / rt.platform.socket.ddr_bandwidth;
  if (to_zion) {
    rt.timeline.advance_host(staging);
    transfer(rt, device, stream, socket, oam, bytes, copy_label(rt, "H2D"));
  } else {
    transfer(rt, device, stream, oam, socket, bytes, copy_label(rt, "D2H"));
  }
  if (!non_blocking || !pinned) rt.timeline.wait_stream(device, stream);
  if (!to_zion) rt.timeline.advance_host(staging);
  rt.timeline.count_copy(device, bytes);
}

}  // namespace zion::device

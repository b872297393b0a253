#include "device/copy.h"

#include "device/runtime.h"
#include "device/stream.h"
#include "device/tensor_alias.h"
#include "sim/platform_topology.h"

namespace zion::device {
namespace {

// The socket whose memory a host buffer of `device`'s rank lives in: the
// first socket on the OAM's PCIe switch (until pinned pools say otherwise).
int home_socket(const sim::Platform& p, int oam) {
  for (const auto& sw : p.pcie.switches) {
    for (int o : sw.oams) {
      if (o == oam) return sw.sockets.front();
    }
  }
  return 0;
}

sim::Seconds transfer_time(const Runtime& rt, int src_vertex, int dst_vertex, double bytes) {
  const sim::Route& r = rt.topology.route(src_vertex, dst_vertex);
  return r.latency + bytes / r.bandwidth;
}

}  // namespace

void copy_between(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.sizes().equals(src.sizes()) || src.numel() == dst.numel() || src.numel() == 1,
              "zion: copy_ between tensors of shapes ", src.sizes(), " and ", dst.sizes());
  at::Tensor s = src.device().is_privateuseone() ? cpu_alias(src) : src;
  at::Tensor d = dst.device().is_privateuseone() ? cpu_alias(dst) : dst;
  d.copy_(s, non_blocking);

  Runtime& rt = runtime();
  double bytes = static_cast<double>(src.numel()) * static_cast<double>(src.element_size());
  bool from_zion = src.device().is_privateuseone(), to_zion = dst.device().is_privateuseone();
  int device = to_zion ? dst.device().index() : src.device().index();
  int stream = static_cast<int>(current_stream(device).id());
  if (from_zion && to_zion) {
    int a = src.device().index(), b = dst.device().index();
    sim::Seconds t = 0;
    if (a == b) {
      t = 2 * bytes / rt.platform.oam.hbm_bandwidth;  // read and write on one device's HBM
    } else {
      t = transfer_time(rt, sim::device_vertex(rt.topology, rt.platform, a), sim::device_vertex(rt.topology, rt.platform, b), bytes);
    }
    rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, t);
    rt.timeline.count_copy(device, bytes);
    return;
  }
  int oam = sim::device_vertex(rt.topology, rt.platform, device);
  int socket = rt.topology.find(sim::VertexKind::kSocket, 0, home_socket(rt.platform, device));
  bool pinned = (to_zion ? src : dst).is_pinned();
  if (to_zion) {
    // Pageable memory is first staged into a pinned buffer by the host.
    if (!pinned) rt.timeline.advance_host(bytes / rt.platform.socket.ddr_bandwidth);
    rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, transfer_time(rt, socket, oam, bytes));
    if (!non_blocking || !pinned) rt.timeline.wait_stream(device, stream);
  } else {
    rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, transfer_time(rt, oam, socket, bytes));
    if (!non_blocking || !pinned) rt.timeline.wait_stream(device, stream);
    if (!pinned) rt.timeline.advance_host(bytes / rt.platform.socket.ddr_bandwidth);
  }
  rt.timeline.count_copy(device, bytes);
}

}  // namespace zion::device

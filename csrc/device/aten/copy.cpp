#include "device/aten/copy.h"

#include <ATen/TensorIterator.h>
#include <c10/util/Exception.h>

#include <cstring>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"
#include "device/aten/tensor_alias.h"
#include "device/aten/timing.h"
#include "device/runtime/allocator.h"
#include "sim/link_model.h"
#include "sim/platform_topology.h"

namespace zion::device {
namespace {

// Copies issued one by one occupy the links of their route one after another
// (FIFO), so two copies over one link on two streams take twice as long as
// one. A batch issued at once (copy_batch) shares its links by max-min fair
// share instead, and leaves the links busy until its bytes are through.
struct LinkOccupancy {
  std::mutex mutex;
  std::vector<sim::Seconds> free_at;
};

LinkOccupancy& links() {
  static LinkOccupancy* instance = new LinkOccupancy();  // never destroyed: copies may come after exit begins
  return *instance;
}

// The span label of a kind of copy: "copy H2D", "copy D2H", "copy D2D".
int copy_label(Runtime& rt, const char* kind) { return rt.timeline.label(std::string("copy ") + kind); }

// Bit c set for each link class c (< 32) the route crosses.
uint32_t route_classes(const sim::Route& route, const std::vector<sim::Link>& all_links) {
  uint32_t classes = 0;
  for (const auto& path : route.paths) {
    for (int l : path.links) classes |= all_links[l].link_class < 32 ? 1u << all_links[l].link_class : 0u;
  }
  return classes;
}

// The link counters of one transfer: its bytes split evenly over the paths.
void count_route(Runtime& rt, const sim::Route& route, double bytes) {
  const auto& all_links = rt.topology.links();
  double per_path = bytes / static_cast<double>(route.paths.size());
  for (const auto& path : route.paths) {
    for (int l : path.links) rt.timeline.count_link(all_links[l].link_class, per_path, per_path / all_links[l].bandwidth);
  }
}

// `occ` sized for the topology; the caller holds its lock.
void size_occupancy(LinkOccupancy& occ, const sim::Topology& topology) {
  if (occ.free_at.size() != topology.links().size()) occ.free_at.assign(topology.links().size(), 0);
}

// When every link of the route is free of the copies queued on it.
sim::Seconds route_free_at(const LinkOccupancy& occ, const sim::Route& route) {
  sim::Seconds ready = 0;
  for (const auto& path : route.paths) {
    for (int l : path.links) ready = std::max(ready, occ.free_at[l]);
  }
  return ready;
}

// Issues a transfer from vertex `src` to vertex `dst` on (device, stream), no
// earlier than `not_before`. The bytes split evenly over the route's
// equal-cost paths.
sim::Interval transfer(Runtime& rt, int device, int stream, int src, int dst, double bytes, int label,
                       sim::Seconds not_before = 0) {
  const sim::Route& route = rt.topology.route(src, dst);
  LinkOccupancy& occ = links();
  std::lock_guard<std::mutex> lock(occ.mutex);
  size_occupancy(occ, rt.topology);
  sim::Seconds ready = std::max(not_before, route_free_at(occ, route));
  sim::Seconds busy = bytes / route.bandwidth;
  sim::Interval in = rt.timeline.launch(device, stream, rt.platform.oam.launch_overhead, route.latency + busy, ready,
                                        sim::Activity::kCopy, label, route_classes(route, rt.topology.links()));
  for (const auto& path : route.paths) {
    for (int l : path.links) occ.free_at[l] = in.start + busy;
  }
  count_route(rt, route, bytes);
  return in;
}

// Whether copy_ from `src` to `dst` writes exactly src's bytes as they lie:
// the same dtype, sizes and strides over a dense block of memory, the same
// lazy conj and neg bits, no overlap. A small copy like that (a batch moved
// to the device) is one memcpy; copy_ on CPU aliases would build a
// TensorIterator for it. From at::internal::GRAIN_SIZE elements on, copy_
// runs on several threads, and it keeps those.
bool copies_as_bytes(const at::Tensor& src, const at::Tensor& dst) {
  if (src.numel() == 0 || src.numel() >= at::internal::GRAIN_SIZE || src.dtype() != dst.dtype() ||
      src.is_conj() != dst.is_conj() || src.is_neg() != dst.is_neg() || src.is_quantized() || dst.is_quantized() ||
      !src.sizes().equals(dst.sizes()) || !src.strides().equals(dst.strides()) || !src.is_non_overlapping_and_dense()) {
    return false;
  }
  const auto* s = static_cast<const char*>(src.const_data_ptr());
  const auto* d = static_cast<const char*>(dst.const_data_ptr());
  const size_t n = src.nbytes();
  return s + n <= d || d + n <= s;
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
  if (is_storage_less(dst)) {
    // Timing-only mode: no bytes move, the destination has none. The copy is
    // priced below as in real mode.
  } else if (is_storage_less(src) && dst.device().is_privateuseone() && covers_storage(dst)) {
    // Into a whole real zion tensor (a float-to-integer conversion, .to(),
    // copy_): the destination has no known values either, so it becomes
    // storage-less, and its bytes go back to the host.
    make_storage_less(dst);
  } else if (is_storage_less(src)) {
    // A storage-less value read into real memory (.cpu(), .tolist(),
    // printing, part of a real tensor): zeros stand in, counted.
    record_placeholder_read(src, dst.device().is_privateuseone() ? "a copy into part of a real zion tensor"
                                                                 : "a copy to host memory (.cpu(), .tolist(), printing)");
    at::Tensor d = dst.device().is_privateuseone() ? cpu_alias(dst) : dst;
    d.zero_();
  } else if (src.device().is_privateuseone() && dst.device().is_privateuseone() && src.storage().is_alias_of(dst.storage())) {
    // Within one zion storage: one CPU alias of it for both sides, so copy_
    // sees the overlap as it does on the CPU (and refuses a partial one).
    AliasSet aliases(dst.device().index());
    aliases.alias(dst).copy_(aliases.alias(src), non_blocking);
  } else if (copies_as_bytes(src, dst)) {
    std::memcpy(dst.mutable_data_ptr(), src.const_data_ptr(), src.nbytes());
  } else {
    at::Tensor s = src.device().is_privateuseone() ? cpu_alias(src) : src;
    at::Tensor d = dst.device().is_privateuseone() ? cpu_alias(dst) : dst;
    d.copy_(s, non_blocking);
  }

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
      rt.timeline.count_copy(device, bytes);
      return;
    }
    // Between devices, as CUDA's copy_ does a peer copy (ATen's Copy.cu): on
    // the source's current stream, after a two-way barrier. The copy waits
    // for the destination's current stream (nobody may still use the
    // destination's memory), and that stream waits for the copy. Copies from
    // several devices therefore run side by side on their sources' streams;
    // copies into one device's current stream run one after another.
    int src_stream = static_cast<int>(current_stream(a).id());
    sim::Seconds dst_ready = rt.timeline.stream_time(b, stream);
    sim::Interval in = transfer(rt, a, src_stream, sim::device_vertex(rt.topology, rt.platform, a),
                                sim::device_vertex(rt.topology, rt.platform, b), bytes, copy_label(rt, "D2D"), dst_ready);
    rt.timeline.stream_wait_until(b, stream, in.end);
    rt.timeline.count_copy(a, bytes);
    return;
  }
  const at::Tensor& host = to_zion ? src : dst;
  // The host side is the socket whose DDR holds the tensor (pinned memory,
  // or memory placed by zion_emu.socket(i)); other memory counts as the
  // device's home socket's.
  const void* host_ptr = host.numel() ? host.const_data_ptr() : nullptr;
  int placed_socket = pinned_allocator().socket_of(host_ptr);
  bool pinned = placed_socket >= 0 && pinned_allocator().is_pinned(host_ptr);
  int socket_index = placed_socket >= 0 ? placed_socket : home_socket(rt.platform, device);
  price_host_copy(device, socket_index, pinned, bytes, to_zion, non_blocking);
}

void price_host_copy(int device, int socket_index, bool pinned, double bytes, bool to_zion, bool non_blocking) {
  Runtime& rt = runtime();
  TORCH_CHECK_INDEX(device >= 0 && device < rt.platform.oam.count, "zion: device ", device, " does not exist");
  TORCH_CHECK_INDEX(socket_index >= 0 && socket_index < rt.platform.socket.count, "zion: socket ", socket_index,
                    " does not exist");
  int stream = static_cast<int>(current_stream(device).id());
  // The route from the socket crosses UPI when it is not the one the OAM's PCIe switch hangs off.
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

void copy_batch(at::TensorList srcs, at::TensorList dsts, c10::IntArrayRef streams) {
  TORCH_CHECK(srcs.size() == dsts.size(), "zion: copy_batch takes one destination per source; got ", srcs.size(),
              " sources and ", dsts.size(), " destinations");
  TORCH_CHECK(streams.empty() || streams.size() == srcs.size(), "zion: copy_batch takes one stream per copy (or none); got ",
              streams.size(), " streams for ", srcs.size(), " copies");
  for (size_t i = 0; i < srcs.size(); ++i) {
    TORCH_CHECK(srcs[i].device().is_privateuseone() && dsts[i].device().is_privateuseone(),
                "zion: copy_batch copies between zion tensors; copy ", i, " is ", srcs[i].device(), " -> ",
                dsts[i].device());
    TORCH_CHECK(srcs[i].sizes().equals(dsts[i].sizes()) && srcs[i].scalar_type() == dsts[i].scalar_type(),
                "zion: copy_batch copies like to like; copy ", i, " is ", srcs[i].scalar_type(), srcs[i].sizes(),
                " -> ", dsts[i].scalar_type(), dsts[i].sizes());
  }
  Runtime& rt = runtime();
  const sim::Seconds launch = rt.platform.oam.launch_overhead;
  struct Copy {
    int device, stream, source;
    double bytes;
    const sim::Route* route = nullptr;  // null: within one device
    int transfer = -1;                  // index in the link model's batch
  };
  std::vector<Copy> copies;
  for (size_t i = 0; i < srcs.size(); ++i) {
    int a = srcs[i].device().index(), b = dsts[i].device().index();
    int stream = static_cast<int>(current_stream(b).id());
    if (!streams.empty() && streams[i] >= 0) {
      TORCH_CHECK(streams[i] < rt.timeline.streams(b), "zion: copy_batch: copy ", i, " names stream ", streams[i],
                  " of zion:", b, ", which has ", rt.timeline.streams(b), " streams");
      stream = static_cast<int>(streams[i]);
    }
    double bytes = static_cast<double>(dsts[i].numel()) * static_cast<double>(dsts[i].element_size());
    copies.push_back({b, stream, a, bytes});
  }
  // The numerics: plain copies, byte for byte.
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (is_storage_less(dsts[i])) continue;  // timing-only: no bytes move
    if (is_storage_less(srcs[i]) && covers_storage(dsts[i])) {
      make_storage_less(dsts[i]);
      continue;
    }
    if (is_storage_less(srcs[i])) {
      record_placeholder_read(srcs[i], "a copy into part of a real zion tensor");
      cpu_alias(dsts[i]).zero_();
      continue;
    }
    cpu_alias(dsts[i]).copy_(cpu_alias(srcs[i]));
  }

  // One lock for the whole batch: no single copy takes the links between the
  // moment the batch reads their free times and the moment it occupies them.
  LinkOccupancy& occ = links();
  std::lock_guard<std::mutex> lock(occ.mutex);
  size_occupancy(occ, rt.topology);
  std::vector<sim::Transfer> transfers;
  std::vector<sim::Interval> local(copies.size());  // copies within one device
  sim::Seconds host = rt.timeline.host();
  for (size_t i = 0; i < copies.size(); ++i) {
    Copy& c = copies[i];
    host += launch;  // the host issues the copies one after another
    sim::Seconds stream_ready = rt.timeline.stream_time(c.device, c.stream);
    if (c.source == c.device) {
      // Within one device: HBM read and write.
      local[i].start = std::max(host, stream_ready);
      local[i].end = local[i].start + 2 * c.bytes / rt.platform.oam.hbm_bandwidth;
      continue;
    }
    int src_vertex = sim::device_vertex(rt.topology, rt.platform, c.source);
    int dst_vertex = sim::device_vertex(rt.topology, rt.platform, c.device);
    c.route = &rt.topology.route(src_vertex, dst_vertex);
    sim::Transfer t;
    t.src = src_vertex;
    t.dst = dst_vertex;
    t.bytes = c.bytes;
    // The bytes are ready once the source's current stream has made them.
    int source_stream = static_cast<int>(current_stream(c.source).id());
    t.not_before = std::max({host, stream_ready, rt.timeline.stream_time(c.source, source_stream),
                             route_free_at(occ, *c.route)});
    c.transfer = static_cast<int>(transfers.size());
    transfers.push_back(std::move(t));
  }
  sim::SimulationResult shared = sim::simulate(rt.topology, transfers, sim::LinkModel::kFair);

  // The copies landing on one stream are one piece of work there (as one
  // grouped NCCL kernel): they run side by side, and the stream is done when
  // the last of them is. One span per stream, from its first start to its
  // last end.
  struct StreamWork {
    sim::Interval span{std::numeric_limits<double>::infinity(), 0};
    uint32_t classes = 0;
  };
  std::map<std::pair<int, int>, StreamWork> work;
  const auto& all_links = rt.topology.links();
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    sim::Interval in = local[i];
    StreamWork& w = work[{c.device, c.stream}];
    if (c.route != nullptr) {
      const sim::TransferTiming& at = shared.timings[c.transfer];
      in = {at.start, at.end};
      w.classes |= route_classes(*c.route, all_links);
      // A path's links carry the copy's bytes until its latency before the end.
      for (const auto& path : c.route->paths) {
        for (int l : path.links) occ.free_at[l] = std::max(occ.free_at[l], at.end - path.latency);
      }
      count_route(rt, *c.route, c.bytes);
    }
    w.span.start = std::min(w.span.start, in.start);
    w.span.end = std::max(w.span.end, in.end);
    rt.timeline.count_copy(c.device, c.bytes);
  }
  rt.timeline.advance_host(launch * static_cast<double>(copies.size()));
  const int label = copy_label(rt, "D2D");
  for (const auto& [stream, w] : work) {
    rt.timeline.record(stream.first, stream.second, w.span, sim::Activity::kCopy, label, w.classes);
    rt.timeline.stream_wait_until(stream.first, stream.second, w.span.end);
  }
}

}  // namespace zion::device

#pragma once
// ASTRA-sim 2.0's system layer and analytical network backends, emulated
// event by event for one-dimensional networks, so that a collective takes the
// nanoseconds ASTRA-sim reports (astra-sim/astra-sim at 518bd51:
// system/astraccl/native_collectives/collective_algorithm/Ring.cc and
// AllToAll.cc, system/PacketBundle.cc, system/MemBus.cc; the analytical
// backend astra-sim/astra-network-analytical at 599a047: congestion_aware
// Link/Chunk/Device and Ring/Switch/FullyConnected, congestion_unaware
// BasicTopology).
//
// The system layer: the data is split into `splits` streams (chunks), at most
// `active_chunks` of them running at once on an NPU. In a stream each NPU
// creates packets (msg bytes each) and sends them when a "General" event
// frees a slot:
//   - ring (Ring.cc): one packet at a time to the ring neighbour;
//     all_reduce 2(n-1) packets of chunk/n, reduce_scatter n-1 of chunk/n,
//     all_gather n-1 of chunk, all_to_all n(n-1)/2 of chunk/n;
//   - direct (AllToAll.cc): `window` packets at once (n-1 by default), to the
//     NPUs in turn; all_reduce sends its second half only once n-1 packets
//     have arrived.
// A packet is created at the stream's start or when one arrives; it reaches
// the algorithm after the endpoint delay (MemBus), plus 3 x floor(msg /
// local memory bandwidth) when it carries a reduction (PacketBundle: a write
// and two reads). Which packets reduce follows Ring.cc's counters: after each
// "zero-latency" round of `window` packets come window x (n-1) (ring) or
// window (direct) others, which reduce in reduce_scatter, and in all_reduce
// every other round.
//
// The network, congestion-aware: store and forward over each link of the
// route, a link sending one message at a time in FIFO order; a message takes
// floor(latency + bytes / bandwidth) to cross a link, which is free again
// after floor(bytes / bandwidth). Rings are bidirectional (shortest way), a
// switch is two links (NPU -> switch -> NPU), fully connected one.
// Congestion-unaware: floor(hops x latency + bytes / bandwidth), no queueing.
// Bandwidth is in GB/s with GB = 2^30 B, latency in ns; local memory
// bandwidth in GB/s with GB = 10^9 B.

#include <cstdint>
#include <string>

#include "collective.h"

namespace zion::sim {

enum class AstraBlock { kRing, kFullyConnected, kSwitch };
enum class AstraImplementation { kRing, kDirect };
enum class AstraBackend { kCongestionAware, kCongestionUnaware };

struct AstraEmulation {
  AstraBlock topology = AstraBlock::kRing;
  int npus = 8;
  double bandwidth_gb_per_s = 0;  // GB = 2^30 B
  double latency_ns = 0;
  AstraImplementation implementation = AstraImplementation::kRing;
  int direct_window = -1;  // direct: packets in flight at once; -1 = npus - 1
  double endpoint_delay_ns = 10;
  int splits = 1;         // preferred-dataset-splits
  int active_chunks = 1;  // active-chunks-per-dimension
  double local_memory_gb_per_s = 0;  // GB = 10^9 B; 0: reductions take no time
  AstraBackend backend = AstraBackend::kCongestionAware;
};

struct AstraEmulationResult {
  uint64_t time_ns = 0;
  uint64_t messages = 0;  // network messages sent
};

// `bytes` is ASTRA-sim's collective size: the buffer of all_reduce and
// all_to_all, the input of reduce_scatter, each NPU's contribution to
// all_gather. Throws std::invalid_argument naming what is out of range or
// not emulated (ops other than all_reduce, reduce_scatter, all_gather,
// all_to_all).
AstraEmulationResult emulate_astra(CollectiveOp op, uint64_t bytes, const AstraEmulation& setup);

}  // namespace zion::sim

#pragma once
// zion in torch.profiler: a Kineto activity profiler registered for
// PrivateUse1 (torch's PrivateUse1ProfilerRegistry). A profiling session
// turns the modeled timeline's spans into device events: every priced op,
// copy and collective on its OAM and stream, at its modeled start and with
// its modeled duration, linked to the CPU op that issued it.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zion::device {

// The host clock of the last profiling session that ended, for a host track in
// modeled time. Each op and record_function range the session saw, by its
// correlation id (the host event's "External id"): the modeled host clock at
// its push and at its pop (NaN if it never popped). And at each op boundary
// (wall_ns, host_s): the wall clock torch's profiler stamps host events with
// (ns since the epoch) and the modeled host clock, for host events without a
// correlation id. Device events sit at wall0_ns + (modeled start -
// host_start_s). `valid` is false until a session that saw zion work ends.
struct HostClockMap {
  bool valid = false;
  int64_t wall0_ns = 0;
  double host_start_s = 0;
  std::vector<int64_t> wall_ns;
  std::vector<double> host_s;
  std::vector<uint64_t> ids;
  std::vector<double> begin_s, end_s;
};
HostClockMap last_host_clock_map();

// The span cap the run asked the timeline to record with (0: not recording).
// A profiling session records spans only when nothing else is, and puts this
// cap back when it stops.
void note_span_recording(size_t max_spans);

}  // namespace zion::device

#pragma once
// The virtual timeline: a clock for the host and one per stream of each
// device, plus per-device counters. Issuing work costs the host its launch
// overhead and enqueues the work on a stream: start = max(stream, host),
// end = start + cost. Host-visible results advance the host to the stream.
//
// Thread-safe: every call takes one short lock (ops are issued from the
// main, autograd and data-loader threads at once).

#include <mutex>
#include <vector>

#include "units.h"

namespace zion::sim {

struct DeviceCounters {
  double flops = 0;
  double bytes = 0;       // memory traffic of ops
  double copy_bytes = 0;  // bytes moved by copies into or out of the device
  Seconds busy = 0;       // sum of op and copy durations on the device's streams
  long long ops = 0;
  long long guessed_ops = 0;  // priced by the default formula, not a known one
};

struct Interval {
  Seconds start = 0;
  Seconds end = 0;
};

class Timeline {
 public:
  explicit Timeline(int devices = 0);

  void resize(int devices);
  int devices() const;

  Seconds host() const;
  // A new stream on `device`; stream 0 always exists (the default stream).
  int new_stream(int device);
  int streams(int device) const;

  // The host spends `launch_overhead` issuing work that then runs for
  // `duration` on (device, stream), no earlier than `not_before`.
  Interval launch(int device, int stream, Seconds launch_overhead, Seconds duration, Seconds not_before = 0);
  void count(int device, double flops, double bytes, bool guessed);
  void count_copy(int device, double bytes);

  Seconds stream_time(int device, int stream) const;
  // The host waits for one stream, or for every stream of a device.
  Seconds wait_stream(int device, int stream);
  Seconds wait_device(int device);
  // The host waits for a time (an event).
  Seconds wait_until(Seconds t);
  // A stream waits for a time (an event recorded elsewhere).
  void stream_wait_until(int device, int stream, Seconds t);
  // The host advances by work of its own (e.g. CPU ops, pageable staging).
  Seconds advance_host(Seconds duration);

  DeviceCounters counters(int device) const;
  void reset();

 private:
  void check(int device, int stream) const;

  mutable std::mutex mutex_;
  Seconds host_ = 0;
  std::vector<std::vector<Seconds>> streams_;  // [device][stream] -> time the stream is free
  std::vector<DeviceCounters> counters_;
};

}  // namespace zion::sim

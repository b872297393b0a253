#pragma once
// The virtual timeline: a clock for the host and one per stream of each
// device, plus per-device counters. Issuing work costs the host its launch
// overhead and enqueues the work on a stream: start = max(stream, host),
// end = start + cost. Host-visible results advance the host to the stream.
//
// Thread-safe: every call takes one short lock (ops are issued from the
// main, autograd and data-loader threads at once).

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "units.h"

namespace zion::sim {

// What a span of stream time is spent on.
enum class Activity : uint8_t { kCompute = 0, kCopy = 1, kCommunication = 2 };
constexpr int kActivities = 3;
const char* activity_name(Activity a);

struct DeviceCounters {
  double flops = 0;
  double bytes = 0;       // memory traffic of ops
  double copy_bytes = 0;  // bytes moved by copies into or out of the device
  Seconds busy = 0;       // sum of op, copy and collective durations on the device's streams
  Seconds busy_by_activity[kActivities] = {0, 0, 0};
  long long ops = 0;
  long long guessed_ops = 0;  // priced by the default formula, not a known one
};

// Traffic over one class of links (e.g. "pcie_gen3_x16", "fabric"): bytes
// summed over every link of the class a transfer crosses, and the time
// those links were busy with it (bytes / link bandwidth, per link).
struct LinkCounters {
  double bytes = 0;
  Seconds busy = 0;
  long long transfers = 0;
};

// One piece of work on a stream, kept while recording is on (for traces
// and the exposed-vs-overlapped breakdown).
struct Span {
  Seconds start = 0;
  Seconds end = 0;
  int32_t label = -1;  // Timeline::label() id; -1: none
  int16_t device = 0;
  int16_t stream = 0;
  Activity activity = Activity::kCompute;
  uint32_t link_classes = 0;  // bit c: the work moves bytes over link class c (c < 32)
};

// Stream time spent under one label (an operator, a copy kind, a collective).
struct LabelTotals {
  Seconds busy = 0;
  long long count = 0;
};

struct Interval {
  Seconds start = 0;
  Seconds end = 0;
};

// Everything a run has accumulated on the timeline, for a checkpoint: the
// host clock, every stream's clock, the counters per device and per link
// class, and the totals per label (by name, since label ids depend on the
// order a process first meets them). Recorded spans are not part of it.
struct TimelineState {
  Seconds host = 0;
  std::vector<std::vector<Seconds>> streams;  // [device][stream]
  std::vector<DeviceCounters> counters;       // [device]
  std::vector<LinkCounters> links;            // [link class]
  std::vector<std::pair<std::string, LabelTotals>> label_totals;
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
  // `label` names it in recorded spans (an id from label()).
  // `link_classes` marks the link classes it moves bytes over (bit c for class c).
  Interval launch(int device, int stream, Seconds launch_overhead, Seconds duration, Seconds not_before = 0,
                  Activity activity = Activity::kCompute, int label = -1, uint32_t link_classes = 0);
  // Work whose interval is already decided (e.g. a transfer that only moves
  // a stream's clock forward): counts its busy time and records its span.
  void record(int device, int stream, Interval interval, Activity activity, int label, uint32_t link_classes = 0);
  // Traffic over `link_class` (an id of the topology's link classes).
  void count_link(int link_class, double bytes, Seconds busy);
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
  std::vector<LinkCounters> link_counters() const;  // indexed by link class

  // Names for spans, interned once: the same text gives the same id.
  int label(const std::string& text);
  std::vector<std::string> labels() const;
  std::vector<LabelTotals> label_totals() const;  // indexed by label id; kept whether or not recording
  // Spans are recorded while max_spans > 0, up to max_spans of them; later
  // ones are counted as dropped (counters stay exact regardless).
  void set_recording(size_t max_spans);
  std::vector<Span> spans() const;
  size_t dropped_spans() const;

  void reset();

  // A copy of the clocks and counters (see TimelineState).
  TimelineState state() const;
  // Replaces the clocks and counters with `state`'s. The device count must
  // match (std::invalid_argument otherwise, naming both counts). Streams
  // missing here are created; streams beyond the saved ones start at the
  // restored host clock. Labels are matched by name; labels not in `state`
  // get zero totals. Recorded spans are dropped.
  void restore(const TimelineState& state);

 private:
  void check(int device, int stream) const;
  void keep(int device, int stream, Interval interval, Activity activity, int label, uint32_t link_classes);

  mutable std::mutex mutex_;
  Seconds host_ = 0;
  std::vector<std::vector<Seconds>> streams_;  // [device][stream] -> time the stream is free
  std::vector<DeviceCounters> counters_;
  std::vector<LinkCounters> links_;
  std::vector<std::string> labels_;
  std::vector<LabelTotals> label_totals_;
  std::unordered_map<std::string, int> label_ids_;
  size_t max_spans_ = 0;
  size_t dropped_ = 0;
  std::vector<Span> spans_;
};

}  // namespace zion::sim

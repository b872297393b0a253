// zion in torch.profiler (see profiler.h).
//
// How a device event finds the CPU op that issued it. torch's profiler
// pushes a correlation id on the issuing thread when an op starts and pops it
// when the op ends; Kineto forwards both to this session. At each push and
// pop the session notes every OAM's busy time (the timeline's counter, which
// grows by exactly the duration of each span the timeline records, in the
// same order). When the session stops, replaying the recorded spans' busy
// sums places each span between two of those notes, and so under the op that
// was innermost on the thread that pushed or popped last. That is exact
// while one thread issues work at a time; when threads issue concurrently
// (nn.DataParallel's replicas), a span can be linked to the op of another
// thread that was issuing at the same moment. Its device, stream, start and
// duration stay exact either way.

#include "device/runtime/profiler.h"

#ifdef USE_KINETO

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <libkineto.h>  // CpuTraceBuffer
#include <output_base.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

using libkineto::ActivityType;

// Spans a session records when the run records none: 2^22 spans of 32 bytes.
constexpr size_t kSessionMaxSpans = size_t{1} << 22;
// Device tracks sort below the host's (Kineto puts GPUs there the same way).
constexpr int64_t kDeviceSortIndex = 0x1000000;

std::atomic<size_t> g_run_max_spans{0};

std::mutex g_clock_map_mutex;
HostClockMap g_clock_map;

class ZionProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit ZionProfilerSession(bool annotations) : annotations_(annotations) {}

  // A profile of a process that has not used zion yet leaves the device
  // alone (set_platform may still come): the session begins at the first
  // op boundary after the device started, so the op that started it is not in it.
  void start() override {
    std::lock_guard<std::mutex> lock(mutex_);
    wall_start_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    recording_ = true;
    {
      std::lock_guard<std::mutex> map_lock(g_clock_map_mutex);
      g_clock_map = HostClockMap{};  // this session's, once it has one
    }
    if (initialized()) begin(runtime());
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    std::lock_guard<std::mutex> lock(mutex_);
    recording_ = false;
    status_ = libkineto::TraceStatus::PROCESSING;
    if (!begun_) return;
    Runtime& rt = runtime();
    spans_ = rt.timeline.spans();
    labels_ = rt.timeline.labels();
    size_t dropped = rt.timeline.dropped_spans() - dropped_before_;
    if (dropped > 0) {
      errors_.push_back("zion: " + std::to_string(dropped) + " spans of modeled time were not recorded (the span "
                        "cap was reached); their device events are missing from this profile");
    }
    if (enabled_recording_) rt.timeline.set_recording(g_run_max_spans.load());
  }

  std::vector<std::string> errors() override { return errors_; }

  void pushCorrelationId(uint64_t id) override { note(Event::kPushOp, id); }
  void popCorrelationId() override { note(Event::kPopOp, 0); }
  void pushUserCorrelationId(uint64_t id) override { note(Event::kPushUser, id); }
  void popUserCorrelationId() override { note(Event::kPopUser, 0); }

  void processTrace(libkineto::ActivityLogger& logger) override { emit(logger, nullptr, 0); }
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start_ns,
                    int64_t /*end_ns*/) override {
    emit(logger, &linked, start_ns);
  }

  // The first OAM's name (every OAM with work is named in processTrace): a
  // session that names a device keeps Kineto from labelling pids 0..15 "GPU".
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, kDeviceSortIndex, "zion:0", device_label(0)});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  enum class Event { kPushOp, kPopOp, kPushUser, kPopUser };

  // Everything up to a push or pop: each OAM's busy seconds then, and the op
  // that work recorded after it (until the next note) belongs to; the wall
  // clock (torch's profiler's) and the modeled host clock at that moment.
  struct Note {
    std::vector<double> busy;
    uint64_t owner = 0;
    int64_t wall_ns = 0;
    double host = 0;
  };
  // A record_function range: the notes at its push and at its pop.
  struct UserRange {
    uint64_t id = 0;
    size_t first = 0, last = SIZE_MAX;
  };
  struct Placed {
    size_t note;
    int device, stream;
    int64_t start_ns, end_ns;
  };

  static std::string device_label(int d) {
    // Only a started device has a platform (asking for it would start one).
    std::string platform = initialized() ? runtime().platform.name + " " : "";
    return platform + "OAM " + std::to_string(d) + ", modeled time";
  }

  // Called with mutex_ held.
  void begin(Runtime& rt) {
    oams_ = device_count();
    if (g_run_max_spans.load() == 0) {
      rt.timeline.set_recording(kSessionMaxSpans);
      enabled_recording_ = true;
    }
    first_span_ = rt.timeline.spans().size();
    dropped_before_ = rt.timeline.dropped_spans();
    base_busy_ = busy(rt);
    host_start_ = rt.timeline.host();
    begun_ = true;
  }

  std::vector<double> busy(Runtime& rt) const {
    std::vector<double> out(oams_);
    for (int d = 0; d < oams_; ++d) out[d] = rt.timeline.counters(d).busy;
    return out;
  }

  void note(Event e, uint64_t id) {
    if (!initialized()) return;  // no zion work yet: nothing to place
    Runtime& rt = runtime();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recording_) return;
    if (!begun_) begin(rt);
    Thread& t = threads_[std::this_thread::get_id()];
    const double host = rt.timeline.host();
    switch (e) {
      case Event::kPushOp:
        t.ops.push_back(id);
        host_spans_[id] = {host, std::nan("")};
        break;
      case Event::kPopOp:
        if (!t.ops.empty()) {
          host_spans_[t.ops.back()].second = host;
          t.ops.pop_back();
        }
        break;
      case Event::kPushUser:
        t.user.push_back(ranges_.size());
        ranges_.push_back(UserRange{id, notes_.size()});
        host_spans_[id] = {host, std::nan("")};
        break;
      case Event::kPopUser:
        if (!t.user.empty()) {
          ranges_[t.user.back()].last = notes_.size();
          host_spans_[ranges_[t.user.back()].id].second = host;
          t.user.pop_back();
        }
        break;
    }
    notes_.push_back(Note{busy(rt), t.ops.empty() ? 0 : t.ops.back(), c10::getTime(), host});
  }

  void emit(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback* linked, int64_t start_ns) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!begun_) return;
    const int64_t wall0 = start_ns > 0 ? start_ns : wall_start_ns_;
    auto wall = [&](double modeled) { return wall0 + std::llround((modeled - host_start_) * 1e9); };
    std::set<std::pair<int, int>> tracks;
    std::vector<Placed> placed;  // each span after the note it follows
    for (int d = 0; d < oams_; ++d) {
      double cumulative = base_busy_[d];
      size_t next = 0;  // first note at or past the span
      for (size_t i = first_span_; i < spans_.size(); ++i) {
        const sim::Span& s = spans_[i];
        if (s.device != d) continue;
        cumulative += s.end - s.start;
        while (next < notes_.size() && notes_[next].busy[d] < cumulative) ++next;
        // Recorded after note next-1 (if any) and before note next.
        uint64_t owner = next > 0 ? notes_[next - 1].owner : 0;
        libkineto::GenericTraceActivity act;
        act.activityType = s.activity == sim::Activity::kCopy ? ActivityType::GPU_MEMCPY
                                                              : ActivityType::CONCURRENT_KERNEL;
        act.activityName = s.label >= 0 && s.label < static_cast<int32_t>(labels_.size())
                               ? labels_[s.label] : sim::activity_name(s.activity);
        act.startTime = wall(s.start);
        act.endTime = wall(s.end);
        act.device = d;
        act.resource = s.stream;
        act.id = static_cast<int32_t>(owner);
        if (owner != 0 && linked != nullptr) act.linked = (*linked)(static_cast<int32_t>(owner));
        act.addMetadataQuoted("device", "zion:" + std::to_string(d));
        act.addMetadata("stream", s.stream);
        act.addMetadataQuoted("activity", sim::activity_name(s.activity));
        act.addMetadata("modeled start (us)", s.start * 1e6);
        act.addMetadata("modeled duration (us)", (s.end - s.start) * 1e6);
        if (owner != 0) act.addMetadata("correlation", owner);
        act.log(logger);
        tracks.insert({d, s.stream});
        if (next > 0) placed.push_back(Placed{next - 1, d, s.stream, act.startTime, act.endTime});
      }
    }
    // A record_function range covers the work issued between its push and its
    // pop: notes [first, last). Spans are placed in note order per device.
    std::map<std::tuple<size_t, int, int>, std::pair<int64_t, int64_t>> annotated;
    if (annotations_) {
      std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) { return a.note < b.note; });
      for (size_t r = 0; r < ranges_.size(); ++r) {
        auto it = std::lower_bound(placed.begin(), placed.end(), ranges_[r].first,
                                   [](const Placed& p, size_t note) { return p.note < note; });
        for (; it != placed.end() && it->note < ranges_[r].last; ++it) {
          auto [slot, fresh] = annotated.try_emplace({r, it->device, it->stream}, it->start_ns, it->end_ns);
          if (!fresh) {
            slot->second.first = std::min(slot->second.first, it->start_ns);
            slot->second.second = std::max(slot->second.second, it->end_ns);
          }
        }
      }
    }
    for (const auto& [key, interval] : annotated) {
      const auto& [r, d, stream] = key;
      const libkineto::ITraceActivity* cpu = linked != nullptr ? (*linked)(static_cast<int32_t>(ranges_[r].id)) : nullptr;
      libkineto::GenericTraceActivity act;
      act.activityType = ActivityType::GPU_USER_ANNOTATION;
      act.activityName = cpu != nullptr ? cpu->name() : "record_function";
      act.startTime = interval.first;
      act.endTime = interval.second;
      act.device = d;
      act.resource = stream;
      act.id = static_cast<int32_t>(ranges_[r].id);
      act.log(logger);
    }
    std::set<int> devices;
    for (const auto& [d, stream] : tracks) {
      if (devices.insert(d).second) {
        logger.handleDeviceInfo(
            libkineto::DeviceInfo{d, kDeviceSortIndex + d, "zion:" + std::to_string(d), device_label(d)}, wall0);
      }
      logger.handleResourceInfo(libkineto::ResourceInfo{stream, stream, d, "stream " + std::to_string(stream)}, wall0);
    }
    publish_clock_map(wall0);
  }

  // Called with mutex_ held, once the trace's start (wall0) is known.
  void publish_clock_map(int64_t wall0) const {
    HostClockMap map;
    map.valid = true;
    map.wall0_ns = wall0;
    map.host_start_s = host_start_;
    map.wall_ns.reserve(notes_.size());
    map.host_s.reserve(notes_.size());
    for (const Note& n : notes_) {
      map.wall_ns.push_back(n.wall_ns);
      map.host_s.push_back(n.host);
    }
    map.ids.reserve(host_spans_.size());
    for (const auto& [id, span] : host_spans_) {
      map.ids.push_back(id);
      map.begin_s.push_back(span.first);
      map.end_s.push_back(span.second);
    }
    std::lock_guard<std::mutex> lock(g_clock_map_mutex);
    g_clock_map = std::move(map);
  }

  struct Thread {
    std::vector<uint64_t> ops;   // correlation ids of the ops open on the thread, innermost last
    std::vector<size_t> user;    // open record_function ranges, innermost last
  };

  const bool annotations_;
  std::mutex mutex_;
  bool recording_ = false;
  bool begun_ = false;
  bool enabled_recording_ = false;
  int oams_ = 0;
  size_t first_span_ = 0;
  size_t dropped_before_ = 0;
  std::vector<double> base_busy_;
  double host_start_ = 0;
  int64_t wall_start_ns_ = 0;
  std::unordered_map<std::thread::id, Thread> threads_;
  std::vector<Note> notes_;
  // Each op's and record_function range's host clock at its push and its pop
  // (NaN while open), by correlation id.
  std::unordered_map<uint64_t, std::pair<double, double>> host_spans_;
  std::vector<UserRange> ranges_;
  std::vector<sim::Span> spans_;
  std::vector<std::string> labels_;
  std::vector<std::string> errors_;
};

class ZionActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config& /*config*/) override {
    if (!types.count(ActivityType::CONCURRENT_KERNEL) && !types.count(ActivityType::GPU_MEMCPY)) return nullptr;
    return std::make_unique<ZionProfilerSession>(types.count(ActivityType::GPU_USER_ANNOTATION) > 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"zion"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::GPU_USER_ANNOTATION};
};

REGISTER_PRIVATEUSE1_PROFILER(ZionActivityProfiler);

}  // namespace

void note_span_recording(size_t max_spans) { g_run_max_spans.store(max_spans); }

HostClockMap last_host_clock_map() {
  std::lock_guard<std::mutex> lock(g_clock_map_mutex);
  return g_clock_map;
}

}  // namespace zion::device

#else  // a torch built without Kineto has no profiler to register with

namespace zion::device {
void note_span_recording(size_t) {}
HostClockMap last_host_clock_map() { return {}; }
}  // namespace zion::device

#endif  // USE_KINETO

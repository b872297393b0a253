#include "timeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zion::sim {

const char* activity_name(Activity a) {
  switch (a) {
    case Activity::kCompute: return "compute";
    case Activity::kCopy: return "copy";
    case Activity::kCommunication: return "communication";
  }
  return "?";
}

Timeline::Timeline(int devices) { resize(devices); }

void Timeline::resize(int devices) {
  std::lock_guard<std::mutex> lock(mutex_);
  streams_.resize(devices, std::vector<Seconds>(1, host_));
  counters_.resize(devices);
}

int Timeline::devices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(streams_.size());
}

void Timeline::check(int device, int stream) const {
  if (device < 0 || device >= static_cast<int>(streams_.size())) {
    throw std::out_of_range("device " + std::to_string(device) + " is not on the timeline (0.." +
                            std::to_string(static_cast<int>(streams_.size()) - 1) + ")");
  }
  if (stream < 0 || stream >= static_cast<int>(streams_[device].size())) {
    throw std::out_of_range("stream " + std::to_string(stream) + " does not exist on device " + std::to_string(device));
  }
}

Seconds Timeline::host() const { return host_now_.load(std::memory_order_acquire); }

void Timeline::publish_host() { host_now_.store(host_, std::memory_order_release); }

int Timeline::new_stream(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  streams_[device].push_back(host_);
  return static_cast<int>(streams_[device].size()) - 1;
}

int Timeline::streams(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  return static_cast<int>(streams_[device].size());
}

Interval Timeline::launch(int device, int stream, Seconds launch_overhead, Seconds duration, Seconds not_before,
                          Activity activity, int label, uint32_t link_classes) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  host_ += launch_overhead;
  publish_host();
  Seconds& free_at = streams_[device][stream];
  Interval in{std::max({free_at, host_, not_before}), 0};
  in.end = in.start + duration;
  free_at = in.end;
  keep(device, stream, in, activity, label, link_classes);
  return in;
}

Interval Timeline::launch_op(int device, int stream, Seconds launch_overhead, Seconds duration, int label,
                             double flops, double bytes, bool guessed) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  host_ += launch_overhead;
  publish_host();
  Seconds& free_at = streams_[device][stream];
  Interval in{std::max({free_at, host_, Seconds{0}}), 0};  // as launch() with not_before = 0
  in.end = in.start + duration;
  free_at = in.end;
  keep(device, stream, in, Activity::kCompute, label, 0);
  DeviceCounters& c = counters_[device];
  c.flops += flops;
  c.bytes += bytes;
  c.ops += 1;
  c.guessed_ops += guessed ? 1 : 0;
  return in;
}

void Timeline::record(int device, int stream, Interval interval, Activity activity, int label, uint32_t link_classes) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  keep(device, stream, interval, activity, label, link_classes);
}

void Timeline::keep(int device, int stream, Interval in, Activity activity, int label, uint32_t link_classes) {
  Seconds duration = in.end - in.start;
  DeviceCounters& c = counters_[device];
  c.busy += duration;
  c.busy_by_activity[static_cast<int>(activity)] += duration;
  if (label >= 0 && label < static_cast<int>(label_totals_.size())) {
    label_totals_[label].busy += duration;
    label_totals_[label].count += 1;
  }
  if (max_spans_ == 0 || duration <= 0) return;
  if (spans_.size() >= max_spans_) {
    ++dropped_;
    return;
  }
  spans_.push_back(Span{in.start, in.end, label, static_cast<int16_t>(device), static_cast<int16_t>(stream), activity,
                        link_classes});
}

void Timeline::count_link(int link_class, double bytes, Seconds busy) {
  if (link_class < 0) throw std::out_of_range("link class " + std::to_string(link_class) + " is negative");
  std::lock_guard<std::mutex> lock(mutex_);
  if (link_class >= static_cast<int>(links_.size())) links_.resize(link_class + 1);
  LinkCounters& c = links_[link_class];
  c.bytes += bytes;
  c.busy += busy;
  c.transfers += 1;
}

std::vector<LinkCounters> Timeline::link_counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return links_;
}

int Timeline::label(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = label_ids_.find(text);
  if (it != label_ids_.end()) return it->second;
  int id = static_cast<int>(labels_.size());
  labels_.push_back(text);
  label_totals_.emplace_back();
  label_ids_.emplace(text, id);
  return id;
}

std::vector<LabelTotals> Timeline::label_totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return label_totals_;
}

std::vector<std::string> Timeline::labels() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return labels_;
}

void Timeline::set_recording(size_t max_spans) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_spans_ = max_spans;
  if (spans_.capacity() < std::min<size_t>(max_spans, 1 << 16)) spans_.reserve(std::min<size_t>(max_spans, 1 << 16));
}

size_t Timeline::recording() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return max_spans_;
}

std::vector<Span> Timeline::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

size_t Timeline::dropped_spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void Timeline::count(int device, double flops, double bytes, bool guessed) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  DeviceCounters& c = counters_[device];
  c.flops += flops;
  c.bytes += bytes;
  c.ops += 1;
  c.guessed_ops += guessed ? 1 : 0;
}

void Timeline::count_compiled_kernel(int device, Seconds busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  counters_[device].compiled_kernels += 1;
  counters_[device].compiled_busy += busy;
}

void Timeline::count_copy(int device, double bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  counters_[device].copy_bytes += bytes;
}

Seconds Timeline::stream_time(int device, int stream) const {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  return streams_[device][stream];
}

Seconds Timeline::wait_stream(int device, int stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  host_ = std::max(host_, streams_[device][stream]);
  publish_host();
  return host_;
}

Seconds Timeline::wait_device(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  for (Seconds t : streams_[device]) host_ = std::max(host_, t);
  publish_host();
  return host_;
}

Seconds Timeline::wait_until(Seconds t) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ = std::max(host_, t);
  publish_host();
  return host_;
}

void Timeline::stream_wait_until(int device, int stream, Seconds t) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  streams_[device][stream] = std::max(streams_[device][stream], t);
}

Seconds Timeline::advance_host(Seconds duration) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ += duration;
  publish_host();
  return host_;
}

DeviceCounters Timeline::counters(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  return counters_[device];
}

void Timeline::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ = 0;
  publish_host();
  for (auto& s : streams_) std::fill(s.begin(), s.end(), 0.0);
  for (auto& c : counters_) c = {};
  for (auto& l : links_) l = {};
  for (auto& t : label_totals_) t = {};
  spans_.clear();
  dropped_ = 0;
}

TimelineState Timeline::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TimelineState s;
  s.host = host_;
  s.streams = streams_;
  s.counters = counters_;
  s.links = links_;
  for (size_t i = 0; i < labels_.size() && i < label_totals_.size(); ++i) {
    if (label_totals_[i].count || label_totals_[i].busy) s.label_totals.emplace_back(labels_[i], label_totals_[i]);
  }
  return s;
}

void Timeline::restore(const TimelineState& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state.streams.size() != streams_.size() || state.counters.size() != streams_.size()) {
    throw std::invalid_argument("the saved timeline has " + std::to_string(state.streams.size()) + " tracks (" +
                                std::to_string(state.counters.size()) + " counter sets); this one has " +
                                std::to_string(streams_.size()) +
                                " (one per device, then one per CPU socket): restore on the same platform");
  }
  for (const auto& device : state.streams) {
    if (device.empty()) throw std::invalid_argument("a saved device has no streams (stream 0 always exists)");
  }
  host_ = state.host;
  publish_host();
  for (size_t d = 0; d < streams_.size(); ++d) {
    const std::vector<Seconds>& saved = state.streams[d];
    std::vector<Seconds>& now = streams_[d];
    if (now.size() < saved.size()) now.resize(saved.size());
    for (size_t s = 0; s < now.size(); ++s) now[s] = s < saved.size() ? saved[s] : host_;
  }
  counters_ = state.counters;
  links_ = state.links;
  for (auto& t : label_totals_) t = {};
  for (const auto& [text, totals] : state.label_totals) {
    auto it = label_ids_.find(text);
    int id = 0;
    if (it != label_ids_.end()) {
      id = it->second;
    } else {
      id = static_cast<int>(labels_.size());
      labels_.push_back(text);
      label_totals_.emplace_back();
      label_ids_.emplace(text, id);
    }
    label_totals_[id] = totals;
  }
  spans_.clear();
  dropped_ = 0;
}

}  // namespace zion::sim

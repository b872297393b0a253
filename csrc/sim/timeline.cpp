#include "timeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zion::sim {

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

Seconds Timeline::host() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return host_;
}

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

Interval Timeline::launch(int device, int stream, Seconds launch_overhead, Seconds duration, Seconds not_before) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, stream);
  host_ += launch_overhead;
  Seconds& free_at = streams_[device][stream];
  Interval in{std::max({free_at, host_, not_before}), 0};
  in.end = in.start + duration;
  free_at = in.end;
  counters_[device].busy += duration;
  return in;
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
  return host_;
}

Seconds Timeline::wait_device(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(device, 0);
  for (Seconds t : streams_[device]) host_ = std::max(host_, t);
  return host_;
}

Seconds Timeline::wait_until(Seconds t) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ = std::max(host_, t);
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
  for (auto& s : streams_) std::fill(s.begin(), s.end(), 0.0);
  for (auto& c : counters_) c = {};
}

}  // namespace zion::sim

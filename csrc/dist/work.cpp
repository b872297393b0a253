#include "dist/work.h"

#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::dist {

ZionWork::ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, sim::Seconds end,
                   std::vector<at::Tensor> outputs)
    : Work(rank, type), device_(device), comm_stream_(comm_stream), outputs_(std::move(outputs)), finished_(true), end_(end) {}

ZionWork::ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, Finish finish, Ready ready,
                   std::vector<at::Tensor> outputs)
    : Work(rank, type),
      device_(device),
      comm_stream_(comm_stream),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)),
      ready_(std::move(ready)) {}

void ZionWork::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_) {
    try {
      end_ = finish_();
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_ = true;
    finish_ = nullptr;
  }
  if (error_) std::rethrow_exception(error_);
}

bool ZionWork::isCompleted() {
  if (!finish_if_ready()) return false;
  if (error_ || device_ < 0) return true;
  device::Runtime& rt = device::runtime();
  if (rt.timeline.host() >= end_) return true;
  rt.timeline.advance_host(rt.platform.oam.launch_overhead);
  return false;
}

bool ZionWork::finish_if_ready() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return true;
  }
  if (ready_ && !ready_()) return false;
  try {
    finish();
  } catch (...) {
    // Kept for exception() and wait(), as NCCL's work reports it.
  }
  return true;
}

bool ZionWork::isSuccess() const { return !error_; }

std::exception_ptr ZionWork::exception() const { return error_; }

sim::Seconds ZionWork::end() {
  finish();
  return end_;
}

bool ZionWork::wait(std::chrono::milliseconds timeout) {
  if (timeout != kNoTimeout && ready_) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!finish_if_ready()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        C10_THROW_ERROR(DistBackendError, "zion backend: " + std::string(c10d::opTypeToString(retrieveOpType())) +
                                              " did not complete within the " + std::to_string(timeout.count()) +
                                              " ms timeout: its peer has not done its side");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  finish();
  if (device_ < 0) return true;  // CPU tensors: nothing modeled to wait for
  auto& timeline = device::runtime().timeline;
  timeline.stream_wait_until(device_, static_cast<int>(device::current_stream(device_).id()), end_);
  if (hold_host_) timeline.wait_until(end_);
  return true;
}

void ZionWork::complete_future() {
  if (device_ < 0) {
    future_->markCompleted(c10::IValue(outputs_));
    return;
  }
  // Marked complete on the communication stream, so the future's event
  // lands at the communication's end, as NCCL's futures do.
  c10::StreamGuard on_comm(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_), comm_stream_));
  future_->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10::ivalue::Future> ZionWork::getFuture() {
  bool in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) return future_;
    std::vector<c10::Device> devices;
    if (device_ >= 0) devices.emplace_back(c10::DeviceType::PrivateUse1, device_);
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    in_flight = !finished_ && ready_;
  }
  if (in_flight) {
    auto self = c10::intrusive_ptr<ZionWork>::reclaim_copy(this);
    std::thread([self] {
      try {
        self->finish();
      } catch (...) {
        self->future_->setError(std::current_exception());
        return;
      }
      self->complete_future();
    }).detach();
    return future_;
  }
  auto future = future_;
  try {
    finish();
  } catch (...) {
    future->setError(std::current_exception());
    return future;
  }
  complete_future();
  return future;
}

}  // namespace zion::dist

#include "dist/work.h"

#include <c10/core/StreamGuard.h>

#include "device/runtime/runtime.h"
#include "device/runtime/stream.h"

namespace zion::dist {

ZionWork::ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, sim::Seconds end,
                   std::vector<at::Tensor> outputs)
    : Work(rank, type), device_(device), comm_stream_(comm_stream), outputs_(std::move(outputs)), finished_(true), end_(end) {}

ZionWork::ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, Finish finish,
                   std::vector<at::Tensor> outputs)
    : Work(rank, type), device_(device), comm_stream_(comm_stream), outputs_(std::move(outputs)), finish_(std::move(finish)) {}

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
  // The data of a point-to-point transfer may still be in flight; finishing
  // it here keeps a polling caller correct (it blocks once).
  finish();
  return true;
}

bool ZionWork::isSuccess() const { return !error_; }

std::exception_ptr ZionWork::exception() const { return error_; }

sim::Seconds ZionWork::end() {
  finish();
  return end_;
}

bool ZionWork::wait(std::chrono::milliseconds /*timeout*/) {
  finish();
  if (device_ < 0) return true;  // CPU tensors: nothing modeled to wait for
  auto& timeline = device::runtime().timeline;
  timeline.stream_wait_until(device_, static_cast<int>(device::current_stream(device_).id()), end_);
  if (hold_host_) timeline.wait_until(end_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> ZionWork::getFuture() {
  finish();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!future_ && device_ < 0) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(outputs_));
  }
  if (!future_) {
    c10::Device device(c10::DeviceType::PrivateUse1, device_);
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device});
    // Marked complete on the communication stream, so the future's event
    // lands at the communication's end, as NCCL's futures do.
    c10::StreamGuard on_comm(c10::Stream(c10::Stream::UNSAFE, device, comm_stream_));
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

}  // namespace zion::dist

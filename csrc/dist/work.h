#pragma once
// The Work a zion collective returns. The bytes have moved by the time the
// call returns (collectives) or by wait() (point-to-point); what is left is
// the virtual time: wait() makes the caller's current stream wait for the
// communication's end, as NCCL's work makes the current CUDA stream wait.

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <mutex>
#include <vector>

#include "sim/units.h"

namespace zion::dist {

class ZionWork : public c10d::Work {
 public:
  // Finishes the communication: waits for the data and returns the virtual
  // time at which it ends on the communication stream.
  using Finish = std::function<sim::Seconds()>;
  // Whether finish would return without waiting for the peer (it has done
  // its side): finish_if_ready's poll and wait's timeout ask it.
  using Ready = std::function<bool()>;

  // A communication that ended at `end` on `comm_stream` of `device`
  // (device -1: CPU tensors, on no modeled timeline).
  ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, sim::Seconds end,
           std::vector<at::Tensor> outputs);
  // One still in flight: `finish` runs once, on the first wait() (or
  // finish_if_ready() once `ready`, or the future's own thread).
  ZionWork(int rank, c10d::OpType type, c10::DeviceIndex device, int comm_stream, Finish finish, Ready ready,
           std::vector<at::Tensor> outputs);

  // A barrier also holds the host until the end: it is how a script
  // lines its ranks up.
  void hold_host() { hold_host_ = true; }

  // Never blocks: whether the bytes have moved, finishing the transfer if
  // its peer has done its side (false while it has not); an error is
  // completion too, reported by exception() and rethrown by wait().
  bool finish_if_ready();
  // As NCCL's work asks its kernels: finish_if_ready, and the host's
  // modeled clock past the communication's end. A query that finds it still
  // running costs the host one launch overhead (a call into the driver), so
  // a loop that polls until completion ends in modeled time.
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // A timeout bounds the wait for the peer: past it, a DistBackendError.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override { wait(); }
  // Completed at the communication's end on the communication stream: a
  // callback or fut.wait() makes its current stream wait for that time. For
  // a transfer still in flight a thread of its own finishes it, so neither
  // this call nor the peer waits for the caller's wait().
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  sim::Seconds end();
  c10::DeviceIndex device() const { return device_; }
  int comm_stream() const { return comm_stream_; }

 private:
  void finish();
  void complete_future();

  c10::DeviceIndex device_;
  int comm_stream_;
  std::vector<at::Tensor> outputs_;
  bool hold_host_ = false;

  std::mutex mutex_;
  Finish finish_;
  Ready ready_;
  bool finished_ = false;
  sim::Seconds end_ = 0;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace zion::dist

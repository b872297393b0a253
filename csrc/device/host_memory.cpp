#include "device/host_memory.h"

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <memory>

#include "device/runtime.h"

namespace zion::device {
namespace {

struct PinnedBuffer {
  void* ptr;
  int socket;
  size_t nbytes;
};

void delete_pinned(void* context) {
  std::unique_ptr<PinnedBuffer> b(static_cast<PinnedBuffer*>(context));
  pinned_allocator().release(b->ptr, b->socket, b->nbytes);
}

std::string gib(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

}  // namespace

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator instance;
  return instance;
}

int home_socket(const sim::Platform& p, int oam) {
  for (const auto& sw : p.pcie.switches) {
    for (int o : sw.oams) {
      if (o == oam) return sw.sockets.front();
    }
  }
  return 0;
}

int current_socket() { return home_socket(runtime().platform, current_device()); }

void PinnedAllocator::configure(const sim::Platform& platform) {
  std::lock_guard<std::mutex> lock(mutex_);
  pools_.assign(platform.socket.count, SocketMemoryStats{});
  for (auto& p : pools_) p.capacity = platform.socket.ddr_bytes;
}

c10::DataPtr PinnedAllocator::allocate(size_t nbytes) {
  int socket = current_socket();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket, " does not exist");
    SocketMemoryStats& p = pools_[socket];
    if (p.in_use + static_cast<int64_t>(nbytes) > p.capacity) {
      p.num_ooms += 1;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "zion: out of pinned DDR on socket ", socket, ". Tried to allocate ",
                       gib(static_cast<int64_t>(nbytes)), " (", nbytes, " bytes); ", gib(p.in_use), " of its ",
                       gib(p.capacity), " DDR capacity are in use. Existing buffers are intact.");
    }
    p.in_use += static_cast<int64_t>(nbytes);
    p.peak = std::max(p.peak, p.in_use);
    p.allocations += 1;
  }
  void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
  if (data) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_[data] = {socket, nbytes};
  }
  return {data, new PinnedBuffer{data, socket, nbytes}, &delete_pinned, c10::Device(c10::DeviceType::CPU)};
}

void PinnedAllocator::release(void* ptr, int socket, size_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ptr) live_.erase(ptr);
    if (socket < static_cast<int>(pools_.size())) {
      pools_[socket].in_use -= static_cast<int64_t>(nbytes);
      pools_[socket].allocations -= 1;
    }
  }
  if (ptr) c10::free_cpu(ptr);
}

void PinnedAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

int PinnedAllocator::socket_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (live_.empty() || !ptr) return -1;
  // Pinned buffers are few and large: a linear scan finds interior pointers.
  auto exact = live_.find(ptr);
  if (exact != live_.end()) return exact->second.first;
  const char* p = static_cast<const char*>(ptr);
  for (const auto& [base, info] : live_) {
    const char* b = static_cast<const char*>(base);
    if (p >= b && p < b + info.second) return info.first;
  }
  return -1;
}

SocketMemoryStats PinnedAllocator::stats(int socket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK_INDEX(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket,
                    " does not exist; the platform has ", pools_.size(), " sockets");
  return pools_[socket];
}

void PinnedAllocator::reset_peak(int socket) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK_INDEX(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket, " does not exist");
  pools_[socket].peak = pools_[socket].in_use;
}

int PinnedAllocator::sockets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(pools_.size());
}

}  // namespace zion::device

#include "device/runtime/host_memory.h"

#include "device/runtime/allocator.h"

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

// Buffers of the pools carry their own address as context (as the default
// CPU allocator's do), so raw_allocate / raw_deleter work on them.
void delete_pooled(void* ptr) { pinned_allocator().release(ptr); }

}  // namespace

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* instance = new PinnedAllocator();  // never destroyed: frees may come after exit begins
  return *instance;
}

int home_socket(const sim::Platform& p, int oam) {
  for (const auto& sw : p.pcie.switches) {
    for (int o : sw.oams) {
      if (o == oam) return sw.sockets.front();
    }
  }
  return 0;
}

namespace {
thread_local int t_scoped_socket = -1;
}  // namespace

int scoped_socket() { return t_scoped_socket; }

void set_scoped_socket(int socket) {
  if (socket >= 0) {
    int count = runtime().platform.socket.count;
    TORCH_CHECK_INDEX(socket < count, "zion: socket ", socket, " does not exist; platform '", runtime().platform.name,
                      "' has ", count, " sockets (0..", count - 1, ")");
  }
  t_scoped_socket = socket;
}

int current_socket() {
  return t_scoped_socket >= 0 ? t_scoped_socket : home_socket(runtime().platform, current_device());
}

void PinnedAllocator::configure(const sim::Platform& platform) {
  std::lock_guard<std::mutex> lock(mutex_);
  configure_locked(platform);
}

void PinnedAllocator::configure_locked(const sim::Platform& platform) {
  pools_.assign(platform.socket.count, SocketMemoryStats{});
  for (auto& p : pools_) p.capacity = platform.socket.ddr_bytes;
}

c10::DataPtr PinnedAllocator::allocate(size_t nbytes) { return allocate_on(current_socket(), nbytes, true); }

c10::DataPtr PinnedAllocator::allocate_on(int socket, size_t nbytes, bool pinned) {
  // Large requests, and every kHostCheckBytes of smaller ones, are checked against the host first.
  const size_t unchecked = unchecked_bytes_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  // A large block is checked and faulted in under the host-wide lock (allocator.h).
  std::optional<HostMemoryLock> host_lock;
  if (nbytes >= kHostCheckBytes) host_lock.emplace();
  if (nbytes >= kHostCheckBytes || unchecked >= kHostCheckBytes) check_host_backing(socket, nbytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket, " does not exist");
    SocketMemoryStats& p = pools_[socket];
    if (p.in_use + static_cast<int64_t>(nbytes) > p.capacity) {
      p.num_ooms += 1;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "zion: out of DDR on socket ", socket, " (",
                       pinned ? "pinned" : "pageable", " host memory). Tried to allocate ",
                       format_size(static_cast<int64_t>(nbytes)), " (", nbytes, " bytes); ", format_size(p.in_use),
                       " of its ", format_size(p.capacity), " DDR capacity are in use. Existing buffers are intact.");
    }
    p.in_use += static_cast<int64_t>(nbytes);
    p.peak = std::max(p.peak, p.in_use);
    p.allocations += 1;
  }
  // Zero bytes still get an address of their own, so every buffer has an
  // entry and its release is found.
  void* data = c10::alloc_cpu(std::max<size_t>(nbytes, 1));
  if (host_lock) {
    touch_pages(data, nbytes);
    host_lock.reset();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_[static_cast<const char*>(data)] = Live{socket, nbytes, std::max<size_t>(nbytes, 1), pinned};
    owned_.store(live_.size(), std::memory_order_relaxed);
  }
  return {data, data, &delete_pooled, c10::Device(c10::DeviceType::CPU)};
}

void PinnedAllocator::reserve(int socket, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK_INDEX(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket, " does not exist");
  SocketMemoryStats& p = pools_[socket];
  if (p.in_use + static_cast<int64_t>(nbytes) > p.capacity) {
    p.num_ooms += 1;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "zion: out of DDR on socket ", socket,
                     " (pageable host memory, timing-only). Tried to allocate ",
                     format_size(static_cast<int64_t>(nbytes)), " (", nbytes, " bytes); ", format_size(p.in_use),
                     " of its ", format_size(p.capacity),
                     " DDR capacity are in use. Existing buffers are intact.");
  }
  p.in_use += static_cast<int64_t>(nbytes);
  p.peak = std::max(p.peak, p.in_use);
  p.allocations += 1;
}

void PinnedAllocator::unreserve(int socket, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A reservation of a platform replaced since keeps no pool's count.
  if (socket < 0 || socket >= static_cast<int>(pools_.size())) return;
  pools_[socket].in_use -= static_cast<int64_t>(nbytes);
  pools_[socket].allocations -= 1;
}

void PinnedAllocator::check_host_backing(int socket, size_t nbytes) {
  unchecked_bytes_.store(0, std::memory_order_relaxed);
  if (socket < 0 || socket >= sockets()) return;  // allocate_on names the socket
  const SocketMemoryStats p = stats(socket);
  // Past the modeled capacity this is the modeled OOM, which allocate_on raises.
  if (p.in_use + static_cast<int64_t>(nbytes) > p.capacity) return;
  const int64_t limit = host_bytes_available();
  if (limit < 0 || static_cast<int64_t>(nbytes) <= limit) return;
  TORCH_CHECK(false, "zion: socket ", socket, " cannot back an allocation of ",
              format_size(static_cast<int64_t>(nbytes)), " with host memory: the modeled DDR pool has room (",
              format_size(p.in_use), " of ", format_size(p.capacity), " in use), but this host has ",
              format_size(std::max<int64_t>(limit, 0)),
              " available to this process. Tensors in a socket's DDR are CPU tensors with host bytes; with --timing-only "
              "(ZION_MODE=timing) the floating-point ones have none. Existing buffers are intact.");
}

bool PinnedAllocator::release(void* ptr) {
  if (!ptr || owned_.load(std::memory_order_relaxed) == 0) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(static_cast<const char*>(ptr));
    if (it == live_.end()) return false;
    int socket = it->second.socket;
    // A buffer of a platform replaced since keeps no pool's count.
    if (socket < static_cast<int>(pools_.size())) {
      pools_[socket].in_use -= static_cast<int64_t>(it->second.nbytes);
      pools_[socket].allocations -= 1;
    }
    live_.erase(it);
    owned_.store(live_.size(), std::memory_order_relaxed);
  }
  c10::free_cpu(ptr);
  return true;
}

void PinnedAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

const PinnedAllocator::Live* PinnedAllocator::find(const void* ptr) const {
  if (live_.empty() || !ptr) return nullptr;
  const char* p = static_cast<const char*>(ptr);
  auto it = live_.upper_bound(p);  // the first buffer starting after p
  if (it == live_.begin()) return nullptr;
  --it;
  return p < it->first + it->second.extent ? &it->second : nullptr;
}

int PinnedAllocator::socket_of(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Live* b = find(ptr);
  return b ? b->socket : -1;
}

bool PinnedAllocator::is_pinned(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Live* b = find(ptr);
  return b && b->pinned;
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

void PinnedAllocator::restore_peak(int socket, int64_t peak, int64_t num_ooms) {
  TORCH_CHECK_VALUE(peak >= 0 && num_ooms >= 0, "zion: saved DDR statistics must be >= 0; got peak=", peak,
                    ", num_ooms=", num_ooms);
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK_INDEX(socket >= 0 && socket < static_cast<int>(pools_.size()), "zion: socket ", socket, " does not exist");
  pools_[socket].peak = std::max(pools_[socket].peak, peak);
  pools_[socket].num_ooms = num_ooms;
}

int PinnedAllocator::sockets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(pools_.size());
}

int64_t PinnedAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_in_use_locked();
}

int64_t PinnedAllocator::bytes_in_use_locked() const {
  int64_t total = 0;
  for (const SocketMemoryStats& p : pools_) total += p.in_use;
  return total;
}

}  // namespace zion::device

#pragma once
// Pinned host memory: one pool per CPU socket with the platform's DDR
// capacity. A pinned buffer belongs to a socket (by default the one the
// current OAM's PCIe switch hangs off); copies from it to an OAM are priced
// on that socket's path and need no staging copy.

#include <c10/core/Allocator.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "sim/platform.h"

namespace zion::device {

struct SocketMemoryStats {
  int64_t capacity = 0;
  int64_t in_use = 0;
  int64_t peak = 0;
  int64_t allocations = 0;  // live
  int64_t num_ooms = 0;
};

class PinnedAllocator final : public c10::Allocator {
 public:
  void configure(const sim::Platform& platform);
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // The socket of a pinned buffer containing `ptr`, or -1 if it is not pinned.
  int socket_of(const void* ptr) const;
  SocketMemoryStats stats(int socket) const;
  void reset_peak(int socket);
  int sockets() const;
  void release(void* ptr, int socket, size_t nbytes);

 private:
  mutable std::mutex mutex_;
  std::vector<SocketMemoryStats> pools_;
  std::unordered_map<const void*, std::pair<int, size_t>> live_;  // base pointer -> socket, bytes
};

PinnedAllocator& pinned_allocator();

// The socket new pinned buffers go to: the one the current OAM's PCIe switch
// hangs off.
int current_socket();
int home_socket(const sim::Platform& platform, int oam);

}  // namespace zion::device

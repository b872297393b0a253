#include "device/runtime/allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "device/runtime/memory_history.h"
#include "device/runtime/host_memory.h"
#include "device/runtime/runtime.h"

namespace zion::device {
namespace {

using c10::CachingAllocator::StatType;
constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);

// What real mode asks of the host, and what to do when the host cannot give it.
constexpr const char* kRealModeHint =
    "Real mode keeps every byte of a zion tensor in host memory; run with --timing-only (zion-emu run "
    "--timing-only, or ZION_MODE=timing) to model it without host bytes. Existing tensors are intact.";

std::string first_line(const char* text) {
  const char* end = std::strchr(text, '\n');
  return end ? std::string(text, end) : std::string(text);
}

// The pool torch.cuda's caching allocator would serve a request from (see
// kSmallPoolMaxBytes); the statistics split by it beside the aggregate, so
// memory_stats' small_pool and large_pool keys add up to its all keys.
size_t pool_of(size_t nbytes) {
  return static_cast<size_t>(nbytes <= kSmallPoolMaxBytes ? StatType::SMALL_POOL : StatType::LARGE_POOL);
}

// A pool keeps no cache and rounds nothing up: every allocation is a segment
// of its own, active, reserved for exactly the bytes requested. So a pool's
// statistics keep allocated bytes and allocations only (per StatType), and
// the reserved, active and requested bytes, segments and active blocks,
// which equal them, are filled in when the statistics are read, as are the
// device allocations and frees (each allocation is one, as a cudaMalloc).
void count(c10::CachingDeviceAllocator::DeviceStats& stats, size_t nbytes, int sign) {
  const size_t pool = pool_of(nbytes);
  if (sign > 0) {
    stats.allocated_bytes[kAggregate].increase(nbytes);
    stats.allocated_bytes[pool].increase(nbytes);
    stats.allocation[kAggregate].increase(1);
    stats.allocation[pool].increase(1);
  } else {
    stats.allocated_bytes[kAggregate].decrease(nbytes);
    stats.allocated_bytes[pool].decrease(nbytes);
    stats.allocation[kAggregate].decrease(1);
    stats.allocation[pool].decrease(1);
  }
}

c10::CachingDeviceAllocator::DeviceStats with_equal_stats(c10::CachingDeviceAllocator::DeviceStats stats) {
  stats.reserved_bytes = stats.active_bytes = stats.requested_bytes = stats.allocated_bytes;
  stats.segment = stats.active = stats.allocation;
  stats.num_device_alloc = stats.allocation[kAggregate].allocated;
  stats.num_device_free = stats.allocation[kAggregate].freed;
  return stats;
}

// What the deleter needs to give the bytes back to their pool.
struct Allocation {
  c10::DeviceIndex device;
  size_t nbytes;
  void* ptr;            // our own bytes (alloc_cpu), or null
  c10::DataPtr adopted;  // bytes adopted from another allocator, freed by its deleter
  bool storage_less = false;  // accounted in the pool, backed by no host bytes (timing-only mode)
  const void* address = nullptr;  // a storage-less block's address (storage_less_address)

  // What the memory history and the profiler know the block by: its address.
  const void* id() const { return storage_less ? address : ptr ? ptr : adopted.get(); }
};

std::atomic<int64_t> g_storage_less_bytes{0};  // of all pools: accounted, not backed

// torch.profiler's profile_memory: each block allocated or freed on a
// device, with the device's allocated and reserved bytes after it (equal:
// the pools cache nothing), as CUDA's caching allocator reports its blocks.
// Read only while a profile records memory.
void report_to_profiler(c10::DeviceIndex device, const void* ptr, int64_t delta) {
  if (!c10::memoryProfilingEnabled()) return;
  const auto allocated = static_cast<size_t>(allocator().allocated_bytes(device));
  c10::reportMemoryUsageToProfiler(const_cast<void*>(ptr), delta, allocated, allocated,
                                   c10::Device(c10::DeviceType::PrivateUse1, device));
}

void delete_allocation(void* context) {
  auto* a = static_cast<Allocation*>(context);
  if (a->storage_less) g_storage_less_bytes.fetch_sub(static_cast<int64_t>(a->nbytes), std::memory_order_relaxed);
  // Recorded before the bytes go back: a block allocated at the same address
  // by another thread then cannot be recorded before this free.
  memory_history().freed(a->device, a->id(), a->nbytes);
  const c10::DeviceIndex device = a->device;
  const size_t nbytes = a->nbytes;
  void* ptr = a->ptr;
  const void* id = a->id();
  a->~Allocation();  // adopted bytes go back to their allocator
  allocator().release(device, ptr, nbytes, a);
  report_to_profiler(device, id, -static_cast<int64_t>(nbytes));
}

// Constructs an allocation's bookkeeping in `raw` (from reserve).
template <typename... Args>
Allocation* make_allocation(void* raw, Args&&... args) {
  return new (raw) Allocation{std::forward<Args>(args)...};
}

// The modeled host clock, for the HBM series. Read under the pool's lock, so
// it must not start the runtime (which configures the pools under that lock):
// a block exists only once the runtime has started.
double host_now() {
  const Runtime* rt = detail::g_runtime_ptr.load(std::memory_order_acquire);
  return rt ? rt->timeline.host() : 0.0;
}

}  // namespace

std::string format_size(int64_t bytes) {
  if (bytes > -1024 && bytes < 1024) return std::to_string(bytes) + " bytes";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (unit < 2 && (value >= 1024 || value <= -1024)) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

HbmAllocator& allocator() {
  static HbmAllocator* instance = new HbmAllocator();  // never destroyed: frees may come after exit begins
  return *instance;
}

void HbmAllocator::configure(const sim::Platform& platform) {
  std::lock_guard<std::mutex> lock(mutex_);
  configure_locked(platform);
}

void HbmAllocator::configure_locked(const sim::Platform& platform) {
  pools_.assign(platform.oam.count, Pool{});
  for (auto& p : pools_) p.capacity = platform.oam.hbm_bytes;
}

size_t HbmAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_in_use_locked();
}

size_t HbmAllocator::bytes_in_use_locked() const {
  int64_t total = 0;
  for (const auto& p : pools_) total += p.stats.allocated_bytes[kAggregate].current;
  return static_cast<size_t>(total);
}

HbmAllocator::Pool& HbmAllocator::pool(c10::DeviceIndex device) {
  TORCH_CHECK_INDEX(device >= 0 && device < static_cast<c10::DeviceIndex>(pools_.size()), "zion: device index ",
                    static_cast<int>(device), " is out of range (0..", static_cast<int64_t>(pools_.size()) - 1, ")");
  return pools_[device];
}

namespace {
// A statistics call (torch.accelerator's, before any zion tensor) starts the
// device, as torch.cuda's calls initialize CUDA: the pools exist from then on.
void started() { (void)runtime(); }
}  // namespace

void HbmAllocator::add_to_series_locked(c10::DeviceIndex device, int64_t delta) {
  if (delta == 0 || device < 0) return;
  const double t = host_now();
  if (static_cast<size_t>(device) >= series_.size()) series_.resize(static_cast<size_t>(device) + 1);
  series_[device].add(t, delta);
}

HbmSeries HbmAllocator::hbm_series(c10::DeviceIndex device, double now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < 0 || static_cast<size_t>(device) >= series_.size()) {
    HbmSeries none;
    none.start_s = none.peak_s = now;
    return none;
  }
  return series_[device].at(now);
}

void* HbmAllocator::reserve(c10::DeviceIndex device, size_t nbytes, bool hold) {
  std::unique_lock<std::mutex> lock(mutex_);
  void* bookkeeping = nullptr;
  if (spare_count_ > 0) {
    bookkeeping = spare_bookkeeping_[--spare_count_];
  } else {  // none spare: malloc's, outside the lock, before anything is counted
    lock.unlock();
    bookkeeping = ::operator new(sizeof(Allocation));
    lock.lock();
  }
  Pool& p = pool_or_give_back(device, bookkeeping);
  auto& in_use = p.stats.allocated_bytes[kAggregate];
  if (in_use.current + p.held + static_cast<int64_t>(nbytes) > p.capacity) {
    p.stats.num_ooms += 1;
    give_back_locked(bookkeeping);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "zion: out of HBM on zion:", static_cast<int>(device),
                     ". Tried to allocate ", format_size(static_cast<int64_t>(nbytes)), " (", nbytes, " bytes); ",
                     format_size(in_use.current), " of its ", format_size(p.capacity), " HBM capacity are in use (",
                     format_size(p.capacity - in_use.current), " free). Existing tensors are intact.");
  }
  if (hold) {
    p.held += static_cast<int64_t>(nbytes);
  } else {
    count(p.stats, nbytes, +1);
    add_to_series_locked(device, static_cast<int64_t>(nbytes));
  }
  return bookkeeping;
}

void HbmAllocator::commit_held(c10::DeviceIndex device, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < static_cast<c10::DeviceIndex>(pools_.size())) {  // else the platform was replaced meanwhile
    pools_[device].held -= static_cast<int64_t>(nbytes);
    count(pools_[device].stats, nbytes, +1);
  }
  add_to_series_locked(device, static_cast<int64_t>(nbytes));
}

void HbmAllocator::release_held(c10::DeviceIndex device, size_t nbytes, void* bookkeeping) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < static_cast<c10::DeviceIndex>(pools_.size())) pools_[device].held -= static_cast<int64_t>(nbytes);
  give_back_locked(bookkeeping);
}

HbmAllocator::Pool& HbmAllocator::pool_or_give_back(c10::DeviceIndex device, void* bookkeeping) {
  if (device < 0 || device >= static_cast<c10::DeviceIndex>(pools_.size())) give_back_locked(bookkeeping);
  return pool(device);  // raises for a device out of range
}

void HbmAllocator::give_back_locked(void* bookkeeping) {
  if (spare_count_ < kSpareBookkeeping) {
    spare_bookkeeping_[spare_count_++] = bookkeeping;
  } else {
    ::operator delete(bookkeeping);
  }
}

void* HbmAllocator::reserve_or_record_oom(c10::DeviceIndex device, size_t nbytes, bool hold) {
  try {
    return reserve(device, nbytes, hold);
  } catch (const c10::OutOfMemoryError&) {
    // Outside the pool's lock: the memory history may take the GIL for the stack.
    memory_history().out_of_memory(device, nbytes, static_cast<int64_t>(getMemoryInfo(device).first));
    throw;
  }
}

c10::DataPtr HbmAllocator::allocate(size_t nbytes) {
  runtime();  // pools are sized by the platform
  c10::DeviceIndex device = current_device();
  // An empty block, as in CUDA's caching allocator, takes nothing from the
  // pool and is not counted: no bytes, no statistics, no history event.
  if (nbytes == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, c10::Device(c10::DeviceType::PrivateUse1, device)};
  // A large block is checked against the host and faulted in under one
  // host-wide lock, so the next process's check sees it (see HostMemoryLock).
  std::optional<HostMemoryLock> host_lock;
  if (nbytes >= kHostCheckBytes) host_lock.emplace();
  check_host_backing(device, nbytes);
  // The statistics and the series count the bytes once the host has backed
  // them, as the memory history does: until then they are held in the pool.
  void* bookkeeping = reserve_or_record_oom(device, nbytes, /*hold=*/true);
  c10::Device where(c10::DeviceType::PrivateUse1, device);
  void* data = nullptr;
  try {
    data = c10::alloc_cpu(nbytes);
  } catch (const c10::Error& e) {
    release_held(device, nbytes, bookkeeping);
    TORCH_CHECK(false, "zion: zion:", static_cast<int>(device), " cannot back an allocation of ",
                format_size(static_cast<int64_t>(nbytes)), " with host memory: the modeled HBM pool has room, but "
                "the host refused the bytes (", first_line(e.what_without_backtrace()), "). ", kRealModeHint);
  } catch (...) {
    release_held(device, nbytes, bookkeeping);
    throw;
  }
  if (host_lock) touch_pages(data, nbytes);
  host_lock.reset();
  commit_held(device, nbytes);
  memory_history().allocated(device, data, nbytes);
  report_to_profiler(device, data, static_cast<int64_t>(nbytes));
  return {data, make_allocation(bookkeeping, device, nbytes, data, c10::DataPtr()), &delete_allocation, where};
}

c10::DataPtr HbmAllocator::allocate_storage_less(c10::DeviceIndex device, size_t nbytes) {
  runtime();
  void* address = reinterpret_cast<void*>(storage_less_address(nbytes));
  void* bookkeeping = reserve_or_record_oom(device, nbytes, /*hold=*/false);
  g_storage_less_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  Allocation* allocation = make_allocation(bookkeeping, device, nbytes, nullptr, c10::DataPtr(), true, address);
  memory_history().allocated(device, address, nbytes);
  report_to_profiler(device, address, static_cast<int64_t>(nbytes));
  return {address, allocation, &delete_allocation, c10::Device(c10::DeviceType::PrivateUse1, device)};
}

namespace {
#if defined(__x86_64__) || defined(_M_X64)
constexpr uintptr_t kStorageLessBase = uintptr_t{1} << 57;
constexpr uintptr_t kStorageLessSpan = uintptr_t{1} << 62;
#else
constexpr uintptr_t kStorageLessBase = uintptr_t{1} << 55;
constexpr uintptr_t kStorageLessSpan = uintptr_t{1} << 55;
#endif
constexpr uintptr_t kStorageLessAlignment = 512;
std::atomic<uintptr_t> g_storage_less_next{0};  // bytes handed out so far, from kStorageLessBase
}  // namespace

uintptr_t storage_less_address(size_t nbytes) {
  TORCH_CHECK(nbytes < kStorageLessSpan, "zion timing-only: a storage-less block of ", nbytes,
              " bytes is larger than the address range storage-less blocks take (", kStorageLessSpan, " bytes)");
  // At least one alignment unit, so that an empty block has an address of its own too.
  const uintptr_t size = (std::max<uintptr_t>(nbytes, 1) + kStorageLessAlignment - 1) & ~(kStorageLessAlignment - 1);
  const uintptr_t offset = g_storage_less_next.fetch_add(size, std::memory_order_relaxed);
  TORCH_CHECK(offset <= kStorageLessSpan - size, "zion timing-only: this process has handed out ", offset,
              " bytes of storage-less addresses, the whole range they take (", kStorageLessSpan,
              " bytes; addresses are never reused, so that each names one storage); start a new process");
  return kStorageLessBase + offset;
}

namespace {
bool read_mode() {
  const char* m = std::getenv("ZION_MODE");
  if (!m || !*m || std::string(m) == "real") return false;
  TORCH_CHECK(std::string(m) == "timing", "zion: ZION_MODE='", m,
              "' is not a mode; it is 'real' (the default: every tensor has its bytes) or 'timing' (timing-only: "
              "floating-point zion tensors have no host bytes)");
  return true;
}
}  // namespace

namespace {

// Bytes from /proc: a field of /proc/meminfo (kB) or resident pages of this process.
int64_t meminfo_bytes(const char* field) {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t value = -1;
  const size_t len = std::strlen(field);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      value = std::atoll(line + len + 1) * 1024;
      break;
    }
  }
  std::fclose(f);
  return value;
}

int64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : -1;
}

}  // namespace

HostMemoryLock::HostMemoryLock() {
  // One file per host (and user): every zion process of a run takes it.
  const std::string path = "/dev/shm/zion-emu-host-memory-" + std::to_string(getuid()) + ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

HostMemoryLock::~HostMemoryLock() {
  if (fd_ < 0) return;
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

void touch_pages(void* data, size_t nbytes) {
  if (!data) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* bytes = static_cast<volatile char*>(data);
  for (size_t i = 0; i < nbytes; i += page) bytes[i] = 0;
  if (nbytes) bytes[nbytes - 1] = 0;
}

int64_t host_bytes_available() {
  const int64_t available = meminfo_bytes("MemAvailable");
  if (available < 0) return -1;  // not Linux's /proc: nothing to compare with
  // Bytes this process's pools hold that it has not touched yet are not in
  // MemAvailable's count of used memory; they will be once written.
  int64_t held = static_cast<int64_t>(allocator().bytes_in_use()) - g_storage_less_bytes.load(std::memory_order_relaxed);
  for (int s = 0; s < pinned_allocator().sockets(); ++s) held += pinned_allocator().stats(s).in_use;
  const int64_t resident = resident_bytes();
  const int64_t untouched = resident < 0 ? 0 : std::max<int64_t>(0, held - resident);
  return available - untouched;
}

void HbmAllocator::check_host_backing(c10::DeviceIndex device, size_t nbytes) {
  // Large requests, and every kHostCheckBytes of smaller ones, are checked.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unchecked_bytes_ += nbytes;
    if (nbytes < kHostCheckBytes && unchecked_bytes_ < kHostCheckBytes) return;
    unchecked_bytes_ = 0;
    // Past the modeled capacity this is the modeled OOM, which reserve() raises.
    const Pool& p = pool(device);
    if (p.stats.allocated_bytes[kAggregate].current + p.held + static_cast<int64_t>(nbytes) > p.capacity) return;
  }
  const int64_t limit = host_bytes_available();
  if (limit < 0 || static_cast<int64_t>(nbytes) <= limit) return;
  int64_t used, capacity;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Pool& p = pool(device);
    used = p.stats.allocated_bytes[kAggregate].current;
    capacity = p.capacity;
  }
  TORCH_CHECK(false, "zion: zion:", static_cast<int>(device), " cannot back an allocation of ",
              format_size(static_cast<int64_t>(nbytes)), " with host memory: the modeled HBM pool has room (",
              format_size(used), " of ", format_size(capacity), " in use), but this host has ",
              format_size(std::max<int64_t>(limit, 0)),
              " available to this process (MemAvailable less what its pools hold untouched). ", kRealModeHint);
}

bool timing_only() {
  static const bool on = read_mode();  // once: the mode cannot change under live tensors
  return on;
}

bool is_storage_less(const c10::StorageImpl* s) {
  if (!s) return false;
  const c10::DataPtr& p = s->data_ptr();
  return p.get_deleter() == &delete_allocation && static_cast<const Allocation*>(p.get_context())->storage_less;
}

namespace {
// A storage-less storage that grows (resize_, an out= argument) stays storage-less.
struct StorageLessAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocator().allocate_storage_less(current_device(), nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
};
}  // namespace

c10::Allocator& storage_less_allocator() {
  static StorageLessAllocator instance;
  return instance;
}

c10::DataPtr HbmAllocator::adopt(c10::DeviceIndex device, c10::DataPtr&& bytes, size_t nbytes) {
  // On failure `bytes` is freed by its owner's deleter.
  // Counted at once, under one lock: every op's result comes here.
  void* bookkeeping = reserve_or_record_oom(device, nbytes, /*hold=*/false);
  void* data = bytes.get();
  try {
    memory_history().allocated(device, data, nbytes);
  } catch (...) {
    release(device, nullptr, nbytes, bookkeeping);  // its bytes stay its owner's
    throw;
  }
  report_to_profiler(device, data, static_cast<int64_t>(nbytes));
  return {data, make_allocation(bookkeeping, device, nbytes, nullptr, std::move(bytes)), &delete_allocation,
          c10::Device(c10::DeviceType::PrivateUse1, device)};
}

void HbmAllocator::release(c10::DeviceIndex device, void* ptr, size_t nbytes, void* bookkeeping) {
  if (ptr) c10::free_cpu(ptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    add_to_series_locked(device, -static_cast<int64_t>(nbytes));
    if (device < static_cast<c10::DeviceIndex>(pools_.size())) {  // else the platform was replaced meanwhile
      count(pools_[device].stats, nbytes, -1);
    }
    if (bookkeeping && spare_count_ < kSpareBookkeeping) {
      spare_bookkeeping_[spare_count_++] = bookkeeping;
      return;
    }
  }
  ::operator delete(bookkeeping);  // outside the lock
}

c10::DeleterFnPtr HbmAllocator::raw_deleter() const { return nullptr; }

void HbmAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) { kernel_host_memory().release_cached(); }

void HbmAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

int64_t HbmAllocator::allocated_bytes(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < 0 || device >= static_cast<c10::DeviceIndex>(pools_.size())) return 0;
  return pools_[device].stats.allocated_bytes[kAggregate].current;
}

c10::CachingDeviceAllocator::DeviceStats HbmAllocator::getDeviceStats(c10::DeviceIndex device) {
  started();
  std::lock_guard<std::mutex> lock(mutex_);
  return with_equal_stats(pool(device).stats);
}

void HbmAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  started();
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = pool(device).stats;
  for (auto* arr : {&s.allocation, &s.allocated_bytes}) {
    for (auto& stat : *arr) stat.reset_accumulated();
  }
  s.num_ooms = 0;
  s.num_alloc_retries = 0;
}

void HbmAllocator::resetPeakStats(c10::DeviceIndex device) {
  started();
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = pool(device).stats;
  for (auto* arr : {&s.allocation, &s.allocated_bytes}) {
    for (auto& stat : *arr) stat.reset_peak();
  }
}

std::pair<size_t, size_t> HbmAllocator::getMemoryInfo(c10::DeviceIndex device) {
  started();
  std::lock_guard<std::mutex> lock(mutex_);
  Pool& p = pool(device);
  int64_t used = p.stats.allocated_bytes[kAggregate].current;
  return {static_cast<size_t>(p.capacity - used), static_cast<size_t>(p.capacity)};
}

int64_t HbmAllocator::capacity(c10::DeviceIndex device) const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(mutex_));
  return const_cast<HbmAllocator*>(this)->pool(device).capacity;
}

void HbmAllocator::restore_peaks(c10::DeviceIndex device, int64_t peak_bytes, int64_t peak_allocations,
                                 int64_t num_ooms) {
  TORCH_CHECK_VALUE(peak_bytes >= 0 && peak_allocations >= 0 && num_ooms >= 0,
                    "zion: saved memory statistics must be >= 0; got peak_bytes=", peak_bytes,
                    ", peak_allocations=", peak_allocations, ", num_ooms=", num_ooms);
  std::lock_guard<std::mutex> lock(mutex_);
  Pool& p = pool(device);
  auto& bytes = p.stats.allocated_bytes[kAggregate];
  bytes.peak = std::max(bytes.peak, peak_bytes);
  auto& allocations = p.stats.allocation[kAggregate];
  allocations.peak = std::max(allocations.peak, peak_allocations);
  p.stats.num_ooms = num_ooms;
}

// The allocator of every zion tensor.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator());

namespace {
thread_local bool t_zion_kernel = false;
}  // namespace

KernelHostMemory::Scope::Scope() : previous_(t_zion_kernel) { t_zion_kernel = true; }
KernelHostMemory::Scope::~Scope() { t_zion_kernel = previous_; }

bool KernelHostMemory::in_zion_kernel() { return t_zion_kernel; }

KernelHostMemory& kernel_host_memory() {
  // Never destroyed: CPU tensors may be freed after static destructors ran.
  static KernelHostMemory* instance = [] {
    auto* cache = new KernelHostMemory(c10::GetCPUAllocator());
    c10::SetCPUAllocator(cache, /*priority=*/1);
    return cache;
  }();
  return *instance;
}

c10::DataPtr KernelHostMemory::allocate(size_t nbytes) {
  if (!t_zion_kernel) return cpu_->allocate(nbytes);
  // A zion kernel's bytes are the device's, which the HBM pool reports to a
  // profile that records memory: the CPU allocator must not report them as
  // the CPU's too. Small blocks are then ours for that profile, uncached.
  if (nbytes < kMinBytes && !c10::memoryProfilingEnabled()) return cpu_->allocate(nbytes);
  void* ptr = nullptr;
  if (nbytes >= kMinBytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cached_.find(nbytes);
    if (it != cached_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= nbytes;
      in_use_.emplace(ptr, nbytes);
    }
  }
  if (!ptr) {
    ptr = c10::alloc_cpu(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_.emplace(ptr, nbytes);
  }
  // Context = data, as the wrapped allocator's: raw_allocate and clone work alike.
  return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::CPU)};
}

void KernelHostMemory::free_block(void* ptr) { kernel_host_memory().give_back(ptr); }

void KernelHostMemory::give_back(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_.find(ptr);
    if (it != in_use_.end()) {
      size_t nbytes = it->second;
      in_use_.erase(it);
      if (nbytes >= kMinBytes && cached_bytes_ + nbytes <= kMaxCachedBytes) {
        cached_[nbytes].push_back(ptr);
        cached_bytes_ += nbytes;
        return;
      }
      c10::free_cpu(ptr);  // the cache is full
      return;
    }
  }
  // Not one of ours: raw_allocate outside a zion kernel, from the wrapped allocator.
  c10::DeleterFnPtr cpu_deleter = cpu_->raw_deleter();
  if (cpu_deleter) {
    cpu_deleter(ptr);
  } else {
    c10::free_cpu(ptr);
  }
}

c10::DeleterFnPtr KernelHostMemory::raw_deleter() const { return &free_block; }

void KernelHostMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

void KernelHostMemory::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [nbytes, blocks] : cached_) {
    for (void* ptr : blocks) c10::free_cpu(ptr);
  }
  cached_.clear();
  cached_bytes_ = 0;
}

size_t KernelHostMemory::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

namespace {
// Installed with the library, before any zion op runs.
const bool kernel_host_memory_installed = (kernel_host_memory(), true);
}  // namespace

}  // namespace zion::device

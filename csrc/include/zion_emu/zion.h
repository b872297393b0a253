#pragma once
// zion-emu for C++ programs: the virtual Zion platform as a libtorch device,
// with no Python interpreter.
//
//   #include <zion_emu/zion.h>
//   zion_emu::set_platform("zion", {{"oam.count", "4"}});   // before the first zion tensor
//   torch::Device dev("zion:0");
//   auto a = torch::randn({1024, 1024}, dev);
//   zion_emu::Event start, end;
//   start.record();  a.matmul(a);  end.record();
//   end.synchronize();
//   double ns = start.elapsed_ns(end);                       // modeled device time
//
// Times are modeled (the virtual timeline of the platform), never host wall
// clock. Link against zion_emu::zion_emu (find_package(zion_emu)); the
// library registers the device's kernels, allocator and guard when loaded.

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zion_emu {

// Names PrivateUse1 "zion", so that torch::Device("zion:3") parses. Idempotent.
// Every program that includes this header calls it before main (below); a
// static initializer of another file that makes a zion Device must call it
// first itself.
void init();

// ---- Platform --------------------------------------------------------------

// `name_or_path`: a preset name ("zion", "zionex", "hgx-h100", ...) or a path
// to a platform JSON file. Overrides are dotted field paths and values, as
// `--set` takes them: {{"fabric.topology", "ring"}, {"oam.count", "4"}}.
// An unknown preset or file, or a bad field, throws std::invalid_argument
// naming it and what is allowed; a call after the first zion tensor was made
// throws c10::Error (the pools hold memory of the current platform).
// Without a call the platform is ZION_PLATFORM's preset, else "zion".
void set_platform(const std::string& name_or_path,
                  const std::vector<std::pair<std::string, std::string>>& overrides = {});
std::string platform_name();
// The active platform as JSON text (every field, as a preset file spells it).
std::string platform_json();
// Preset names found on the search path (ZION_PLATFORM_PATH, then the presets
// the library was built or installed with).
std::vector<std::string> preset_names();

// OAMs per node: zion:0 .. zion:<device_count()-1>.
int device_count();
c10::Device device(int index);  // checked: names the allowed range

// ---- Streams, events, synchronization ---------------------------------------

c10::Stream current_stream(int device = -1);  // -1: the current device
c10::Stream new_stream(int device = -1);
// Makes `stream` current on its device for the life of the guard.
class StreamGuard {
 public:
  explicit StreamGuard(const c10::Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  c10::Stream previous_;
};

// A modeled event: the virtual time its stream reaches once everything issued
// to it before record() has run. Backed by the device guard's events, so
// torch's own c10::Event on a zion stream behaves the same.
class Event {
 public:
  Event();
  void record();                         // on the current stream of the current device
  void record(const c10::Stream& stream);
  bool recorded() const;
  bool query() const;                    // has the host clock passed it?
  void synchronize() const;              // the host waits for it
  void block(const c10::Stream& stream) const;  // `stream` waits for it
  // Modeled nanoseconds from this event to `end` (both recorded).
  double elapsed_ns(const Event& end) const;

 private:
  c10::Event event_;
};

// The host waits for every stream of `device`, or of every device with -1.
void synchronize(int device = -1);
// The host's virtual clock, in modeled nanoseconds since the last reset.
double host_time_ns();
double stream_time_ns(const c10::Stream& stream);
// Clocks, device and link counters back to zero (memory stays allocated).
void reset_clock();

// ---- Memory ------------------------------------------------------------------

struct MemoryStats {
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t allocations = 0;  // live
  int64_t num_ooms = 0;
  int64_t capacity_bytes = 0;  // the OAM's HBM
};
MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);

// Pinned host memory (torch's pin_memory()), one DDR pool per CPU socket.
struct HostMemoryStats {
  int64_t in_use_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;
  int64_t num_ooms = 0;
  int64_t capacity_bytes = 0;
};
int socket_count();
HostMemoryStats host_memory_stats(int socket);

// ---- Counters ----------------------------------------------------------------

struct DeviceCounters {
  double flops = 0;
  double bytes = 0;       // memory traffic of ops
  double copy_bytes = 0;  // moved by copies into or out of the device
  double busy_ns = 0;     // op, copy and collective durations summed over the device's streams
  double compute_busy_ns = 0;        // of which ops
  double copy_busy_ns = 0;           // copies
  double communication_busy_ns = 0;  // collectives
  int64_t ops = 0;
  int64_t guessed_ops = 0;  // priced by the default formula, not a known one
};
DeviceCounters counters(int device);

// Traffic over one class of links of the node's topology ("upi",
// "pcie_gen4_x16", "fabric", "nic", ...), from copies and collectives:
// bytes and busy time summed over every link of the class a transfer crosses.
struct LinkCounters {
  std::string name;
  double bandwidth_bytes_per_s = 0;  // of one link
  double latency_ns = 0;
  int links = 0;  // directed links of the class
  double bytes = 0;
  double busy_ns = 0;
  int64_t transfers = 0;
};
std::vector<LinkCounters> link_counters();

// The route a device-to-device copy takes between two OAMs of a node.
struct OamRoute {
  int hops = 0;
  int paths = 0;                        // equal-cost paths the bytes split over
  double bandwidth_bytes_per_s = 0;     // sum of the paths' bottlenecks
  double latency_ns = 0;
  std::vector<std::string> link_classes;  // of the first path, in order
};
OamRoute oam_route(int src, int dst);

namespace detail {
inline const bool registered = (init(), true);
}  // namespace detail

}  // namespace zion_emu

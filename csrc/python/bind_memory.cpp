// Bindings: the HBM memory history (zion_emu.memory, torch.zion.memory), as
// torch.cuda.memory's snapshot: segments, blocks and per-device traces of
// dicts with the keys torch.cuda._memory_viz reads.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/profiler/python/combined_traceback.h>

#include <cmath>
#include <unordered_map>
#include <vector>

#include "device/runtime/memory_history.h"
#include "device/runtime/runtime.h"

namespace py = pybind11;
using namespace zion;

namespace {

// Symbolizes every stack once; an event without one gets an empty list.
class Frames {
 public:
  void add(const std::shared_ptr<torch::CapturedTraceback>& tb) {
    if (tb && index_.emplace(tb.get(), stacks_.size()).second) stacks_.push_back(tb.get());
  }
  void symbolize() { frames_ = torch::py_symbolize(stacks_); }
  py::object of(const std::shared_ptr<torch::CapturedTraceback>& tb) const {
    if (!tb) return py::list();
    return frames_.at(index_.at(tb.get()));
  }

 private:
  std::vector<torch::CapturedTraceback*> stacks_;
  std::unordered_map<torch::CapturedTraceback*, size_t> index_;
  std::vector<py::object> frames_;
};

py::dict trace_entry(const char* action, const device::MemoryEvent& e, const py::object& frames) {
  py::dict d;
  d["action"] = action;
  d["addr"] = e.address;
  d["size"] = e.nbytes;
  d["stream"] = 0;
  d["time_us"] = static_cast<int64_t>(std::llround(e.time_s * 1e6));
  d["frames"] = frames;
  return d;
}

}  // namespace

void bind_memory(py::module_& m) {
  py::module_ mem = m.def_submodule("memory", "The HBM memory history, in torch.cuda.memory's snapshot format");
  mem.def("record_history", [](bool enabled, size_t max_entries, bool stacks) {
    if (stacks) torch::installCapturedTracebackPython();
    device::memory_history().configure(enabled, max_entries, stacks);
  }, py::arg("enabled"), py::arg("max_entries"), py::arg("stacks"));
  mem.attr("HBM_FIRST_BIN_S") = device::HbmSeries::kFirstBinS;
  mem.attr("HBM_MAX_BINS") = device::HbmSeries::kMaxBins;
  mem.def("hbm_over_time", [](int device) {
    const double now = device::initialized() ? device::runtime().timeline.host() : 0.0;
    device::HbmSeries s = device::memory_history().hbm_series(static_cast<c10::DeviceIndex>(device), now);
    std::vector<double> time_s;
    std::vector<int64_t> max_bytes, end_bytes;
    for (const auto& b : s.bins) {
      time_s.push_back(b.time_s);
      max_bytes.push_back(b.max_bytes);
      end_bytes.push_back(b.end_bytes);
    }
    py::dict out;
    out["bin_s"] = s.bin_s;
    out["start_s"] = s.start_s;
    out["start_bytes"] = s.start_bytes;
    out["time_s"] = time_s;
    out["max_bytes"] = max_bytes;
    out["end_bytes"] = end_bytes;
    out["peak_bytes"] = s.peak_bytes;
    out["peak_s"] = s.peak_s;
    out["current_bytes"] = s.current_bytes;
    out["now_s"] = now;
    return out;
  }, py::arg("device"),
     "Allocated HBM bytes of a device over the modeled host clock (always kept): bins of bin_s seconds, each "
     "with its first event's time, the most allocated after any of its events and what was allocated after its "
     "last; start_bytes were allocated at start_s (time zero or the last clock reset); peak_bytes first at peak_s");
  mem.def("snapshot", [] {
    std::vector<device::MemoryEvent> events = device::memory_history().events();
    std::vector<device::MemoryBlock> live = device::memory_history().live();
    Frames frames;
    for (const auto& e : events) frames.add(e.stack);
    for (const auto& b : live) frames.add(b.stack);
    frames.symbolize();
    int devices = device::initialized() ? device::device_count() : 0;
    py::list traces;
    std::vector<py::list> per_device(devices);
    for (const auto& e : events) {
      if (e.device < 0 || e.device >= devices) continue;
      py::list& t = per_device[e.device];
      py::object f = frames.of(e.stack);
      // The pools cache nothing: every allocation is its own segment.
      switch (e.action) {
        case device::MemoryEvent::Action::kAlloc:
          t.append(trace_entry("segment_alloc", e, f));
          t.append(trace_entry("alloc", e, f));
          break;
        case device::MemoryEvent::Action::kFree:
          t.append(trace_entry("free_requested", e, f));
          t.append(trace_entry("free_completed", e, f));
          t.append(trace_entry("segment_free", e, f));
          break;
        case device::MemoryEvent::Action::kOom: {
          py::dict d = trace_entry("oom", e, f);
          d["device_free"] = e.device_free;
          t.append(d);
          break;
        }
      }
    }
    for (auto& t : per_device) traces.append(t);
    py::list segments;
    for (const auto& b : live) {
      py::object f = frames.of(b.stack);
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.nbytes;
      block["requested_size"] = b.nbytes;
      block["state"] = "active_allocated";
      block["frames"] = f;
      py::dict seg;
      seg["device"] = static_cast<int>(b.device);
      seg["address"] = b.address;
      seg["total_size"] = b.nbytes;
      seg["allocated_size"] = b.nbytes;
      seg["active_size"] = b.nbytes;
      seg["requested_size"] = b.nbytes;
      seg["stream"] = 0;
      seg["segment_type"] = b.nbytes > device::kSmallPoolMaxBytes ? "large" : "small";
      seg["segment_pool_id"] = py::make_tuple(0, 0);
      seg["is_expandable"] = false;
      seg["frames"] = f;
      py::list blocks;
      blocks.append(block);
      seg["blocks"] = blocks;
      segments.append(seg);
    }
    py::dict out;
    out["segments"] = segments;
    out["device_traces"] = traces;
    out["allocator_settings"] = py::dict();
    return out;
  }, "segments: the allocations made while recording and still alive; device_traces: per device, the "
     "allocations, frees and OOMs recorded, oldest first, at modeled host times (time_us)");
}

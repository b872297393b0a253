// Bindings: what the virtual timeline recorded, for the run report and the
// trace (zion_emu.report, zion_emu.trace): spans of stream time, busy time
// per activity, and traffic per link class.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device/runtime/allocator.h"
#include "device/runtime/profiler.h"
#include "device/aten/copy.h"
#include "device/runtime/runtime.h"

namespace py = pybind11;
using namespace zion;

namespace {

template <typename T, typename Field>
py::array_t<T> column(const std::vector<sim::Span>& spans, Field field) {
  py::array_t<T> out(static_cast<py::ssize_t>(spans.size()));
  auto w = out.template mutable_unchecked<1>();
  for (size_t i = 0; i < spans.size(); ++i) w(static_cast<py::ssize_t>(i)) = static_cast<T>(field(spans[i]));
  return out;
}

const char* const kCounterFields[] = {"flops", "bytes", "copy_bytes", "busy_s", "ops", "guessed_ops"};

template <typename T>
T field(const py::dict& d, const char* name, const std::string& where) {
  if (!d.contains(name)) {
    throw py::value_error("zion timeline state: " + where + " has no field '" + name + "'");
  }
  try {
    return d[name].cast<T>();
  } catch (const py::cast_error&) {
    throw py::value_error("zion timeline state: " + where + "." + name + " must be a number, got " +
                          std::string(py::str(py::type::handle_of(d[name]).attr("__name__"))));
  }
}

py::dict state_to_dict(const sim::TimelineState& s) {
  py::dict out;
  out["host_s"] = s.host;
  out["streams_s"] = s.streams;
  py::list devices;
  for (const sim::DeviceCounters& c : s.counters) {
    py::dict d;
    d["flops"] = c.flops;
    d["bytes"] = c.bytes;
    d["copy_bytes"] = c.copy_bytes;
    d["busy_s"] = c.busy;
    d["ops"] = c.ops;
    d["guessed_ops"] = c.guessed_ops;
    d["compiled_kernels"] = c.compiled_kernels;
    d["compiled_busy_s"] = c.compiled_busy;
    d["busy_by_activity_s"] = std::vector<double>(c.busy_by_activity, c.busy_by_activity + sim::kActivities);
    devices.append(d);
  }
  out["devices"] = devices;
  py::list links;
  for (const sim::LinkCounters& l : s.links) {
    py::dict d;
    d["bytes"] = l.bytes;
    d["busy_s"] = l.busy;
    d["transfers"] = l.transfers;
    links.append(d);
  }
  out["links"] = links;
  py::dict labels;
  for (const auto& [name, totals] : s.label_totals) labels[py::str(name)] = py::make_tuple(totals.busy, totals.count);
  out["labels"] = labels;
  return out;
}

sim::TimelineState state_from_dict(const py::dict& d) {
  sim::TimelineState s;
  s.host = field<double>(d, "host_s", "state");
  try {
    s.streams = field<std::vector<std::vector<double>>>(d, "streams_s", "state");
  } catch (const py::value_error&) {
    throw py::value_error("zion timeline state: streams_s must be a list (one per device) of lists of seconds");
  }
  for (const char* key : {"devices", "links", "labels"}) {
    if (!d.contains(key)) throw py::value_error(std::string("zion timeline state: state has no field '") + key + "'");
  }
  int i = 0;
  for (py::handle h : py::list(d["devices"])) {
    std::string where = "devices[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(h)) throw py::value_error("zion timeline state: " + where + " must be a dict");
    py::dict c = py::reinterpret_borrow<py::dict>(h);
    sim::DeviceCounters k;
    k.flops = field<double>(c, kCounterFields[0], where);
    k.bytes = field<double>(c, kCounterFields[1], where);
    k.copy_bytes = field<double>(c, kCounterFields[2], where);
    k.busy = field<double>(c, kCounterFields[3], where);
    k.ops = field<long long>(c, kCounterFields[4], where);
    k.guessed_ops = field<long long>(c, kCounterFields[5], where);
    // Absent from states saved before torch.compile was priced: none ran then.
    if (c.contains("compiled_kernels")) k.compiled_kernels = field<long long>(c, "compiled_kernels", where);
    if (c.contains("compiled_busy_s")) k.compiled_busy = field<double>(c, "compiled_busy_s", where);
    auto by_activity = field<std::vector<double>>(c, "busy_by_activity_s", where);
    if (by_activity.size() != static_cast<size_t>(sim::kActivities)) {
      throw py::value_error("zion timeline state: " + where + ".busy_by_activity_s must have " +
                            std::to_string(sim::kActivities) + " entries (compute, copy, communication)");
    }
    std::copy(by_activity.begin(), by_activity.end(), k.busy_by_activity);
    s.counters.push_back(k);
  }
  i = 0;
  for (py::handle h : py::list(d["links"])) {
    std::string where = "links[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(h)) throw py::value_error("zion timeline state: " + where + " must be a dict");
    py::dict l = py::reinterpret_borrow<py::dict>(h);
    s.links.push_back(sim::LinkCounters{field<double>(l, "bytes", where), field<double>(l, "busy_s", where),
                                        field<long long>(l, "transfers", where)});
  }
  for (auto item : py::dict(d["labels"])) {
    auto pair = item.second.cast<std::pair<double, long long>>();
    s.label_totals.emplace_back(item.first.cast<std::string>(), sim::LabelTotals{pair.first, pair.second});
  }
  return s;
}

}  // namespace

void bind_timeline(py::module_& m) {
  py::module_ t = m.def_submodule("timeline", "What the virtual timeline recorded");
  t.def("set_recording", [](size_t max_spans) {
    device::runtime().timeline.set_recording(max_spans);
    device::note_span_recording(max_spans);  // a torch.profiler session leaves this cap as it found it
  },
        py::arg("max_spans"), "Record up to max_spans spans of stream time (0: stop recording)");
  t.def("profiler_host_clock", []() -> py::object {
    device::HostClockMap map = device::last_host_clock_map();
    if (!map.valid) return py::none();
    py::dict d;
    d["wall0_ns"] = map.wall0_ns;
    d["host_start_s"] = map.host_start_s;
    d["wall_ns"] = py::array_t<int64_t>(static_cast<py::ssize_t>(map.wall_ns.size()), map.wall_ns.data());
    d["host_s"] = py::array_t<double>(static_cast<py::ssize_t>(map.host_s.size()), map.host_s.data());
    d["ids"] = py::array_t<uint64_t>(static_cast<py::ssize_t>(map.ids.size()), map.ids.data());
    d["begin_s"] = py::array_t<double>(static_cast<py::ssize_t>(map.begin_s.size()), map.begin_s.data());
    d["end_s"] = py::array_t<double>(static_cast<py::ssize_t>(map.end_s.size()), map.end_s.data());
    return d;
  }, "The last torch.profiler session's host clock at each op boundary (None before one saw zion work)");
  t.def("advance_host", [](double seconds) {
    if (!(seconds >= 0)) throw py::value_error("advance_host takes a non-negative duration, got " + std::to_string(seconds));
    return device::runtime().timeline.advance_host(seconds);
  }, py::arg("seconds"), "The host works for `seconds` of modeled time; returns the host clock");
  t.def("wait_until", [](double t) { return device::runtime().timeline.wait_until(t); }, py::arg("time"),
        "The host waits until a modeled time (no-op if already past); returns the host clock");
  t.def("horizon", [] {
    sim::Timeline& tl = device::runtime().timeline;
    double end = tl.host();
    for (int d = 0; d < tl.devices(); ++d) {
      for (int s = 0; s < tl.streams(d); ++s) end = std::max(end, tl.stream_time(d, s));
    }
    return end;
  }, "When everything issued so far is done: the latest of the host clock and every stream's clock");
  t.def("dropped_spans", [] { return device::runtime().timeline.dropped_spans(); });
  t.def("labels", [] { return device::runtime().timeline.labels(); });
  t.def("label_totals", [] {
    device::Runtime& rt = device::runtime();
    std::vector<std::string> names = rt.timeline.labels();
    std::vector<sim::LabelTotals> totals = rt.timeline.label_totals();
    py::dict d;
    for (size_t i = 0; i < names.size() && i < totals.size(); ++i) {
      if (totals[i].count) d[py::str(names[i])] = py::make_tuple(totals[i].busy, totals[i].count);
    }
    return d;
  }, "label -> (busy seconds, count) over every device, recorded or not");
  t.def("spans", [] {
    std::vector<sim::Span> spans = device::runtime().timeline.spans();
    py::dict d;
    d["start"] = column<double>(spans, [](const sim::Span& s) { return s.start; });
    d["end"] = column<double>(spans, [](const sim::Span& s) { return s.end; });
    d["label"] = column<int32_t>(spans, [](const sim::Span& s) { return s.label; });
    d["device"] = column<int16_t>(spans, [](const sim::Span& s) { return s.device; });
    d["stream"] = column<int16_t>(spans, [](const sim::Span& s) { return s.stream; });
    d["activity"] = column<uint8_t>(spans, [](const sim::Span& s) { return static_cast<uint8_t>(s.activity); });
    d["link_classes"] = column<uint32_t>(spans, [](const sim::Span& s) { return s.link_classes; });
    return d;
  }, "The recorded spans as columns (numpy arrays); activity 0 compute, 1 copy, 2 communication");
  t.def("activities", [] {
    std::vector<std::string> names;
    for (int a = 0; a < sim::kActivities; ++a) names.push_back(sim::activity_name(static_cast<sim::Activity>(a)));
    return names;
  });
  t.def("busy_by_activity", [](int device) {
    sim::DeviceCounters c = device::runtime().timeline.counters(device);
    py::dict d;
    for (int a = 0; a < sim::kActivities; ++a) d[sim::activity_name(static_cast<sim::Activity>(a))] = c.busy_by_activity[a];
    return d;
  }, py::arg("device"), "Seconds of stream time per activity on one device");
  t.def("link_counters", [] {
    device::Runtime& rt = device::runtime();
    std::vector<sim::LinkCounters> counters = rt.timeline.link_counters();
    const auto& classes = rt.topology.link_classes();
    std::vector<int> links_of_class(classes.size(), 0);
    for (const auto& l : rt.topology.links()) ++links_of_class[l.link_class];
    py::list out;
    for (size_t c = 0; c < classes.size(); ++c) {
      sim::LinkCounters k = c < counters.size() ? counters[c] : sim::LinkCounters{};
      py::dict d;
      d["name"] = classes[c].name;
      d["bandwidth"] = classes[c].bandwidth;
      d["links"] = links_of_class[c];
      d["bytes"] = k.bytes;
      d["busy_s"] = k.busy;
      d["transfers"] = k.transfers;
      out.append(d);
    }
    return out;
  }, "Per link class of the platform: bandwidth per link, directed links of the class, bytes carried "
     "(summed over links), busy seconds (summed over links) and transfers");
  t.def("state", [] {
    py::dict d = state_to_dict(device::runtime().timeline.state());
    d["link_free_s"] = device::link_free_times();
    return d;
  },
        "The clocks and counters for a checkpoint: host_s, streams_s [device][stream], devices (counters), "
        "links (per link class), labels (name -> (busy seconds, count)), link_free_s (when each link is free of "
        "queued copies)");
  t.def("restore", [](const py::dict& d) {
    sim::TimelineState s = state_from_dict(d);
    std::vector<double> link_free = field<std::vector<double>>(d, "link_free_s", "state");
    try {
      device::runtime().timeline.restore(s);
      device::restore_link_free_times(link_free);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(std::string("zion timeline state: ") + e.what());
    }
  }, py::arg("state"), "Replaces the clocks and counters with a state() taken earlier (same platform)");
  t.def("restore_peak_memory", [](int index, int64_t peak_bytes, int64_t peak_allocations, int64_t num_ooms) {
    device::check_device(static_cast<c10::DeviceIndex>(index));
    device::allocator().restore_peaks(static_cast<c10::DeviceIndex>(index), peak_bytes, peak_allocations, num_ooms);
  }, py::arg("index"), py::arg("peak_bytes"), py::arg("peak_allocations"), py::arg("num_ooms"),
     "Raises the HBM peak statistics of a device to saved ones and sets its OOM count");
}

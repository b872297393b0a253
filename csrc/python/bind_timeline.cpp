// Bindings: what the virtual timeline recorded, for the run report and the
// trace (zion_emu.report, zion_emu.trace): spans of stream time, busy time
// per activity, and traffic per link class.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "device/runtime.h"

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

}  // namespace

void bind_timeline(py::module_& m) {
  py::module_ t = m.def_submodule("timeline", "What the virtual timeline recorded");
  t.def("set_recording", [](size_t max_spans) { device::runtime().timeline.set_recording(max_spans); },
        py::arg("max_spans"), "Record up to max_spans spans of stream time (0: stop recording)");
  t.def("advance_host", [](double seconds) {
    if (!(seconds >= 0)) throw py::value_error("advance_host takes a non-negative duration, got " + std::to_string(seconds));
    return device::runtime().timeline.advance_host(seconds);
  }, py::arg("seconds"), "The host works for `seconds` of modeled time; returns the host clock");
  t.def("wait_until", [](double t) { return device::runtime().timeline.wait_until(t); }, py::arg("time"),
        "The host waits until a modeled time (no-op if already past); returns the host clock");
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
}

#pragma once
// Streams and events of the zion device on the virtual timeline.
// A stream is an index into the device's stream clocks (0: the default
// stream); the current stream is per thread and per device, as in CUDA.

#include <c10/core/Stream.h>

#include "sim/units.h"

namespace zion::device {

c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream exchange_stream(c10::Stream stream);
c10::Stream new_stream(c10::DeviceIndex device);

// An event: the virtual time its stream reached when it was recorded.
struct Event {
  c10::DeviceIndex device = 0;
  sim::Seconds time = 0;
  bool recorded = false;
};

}  // namespace zion::device

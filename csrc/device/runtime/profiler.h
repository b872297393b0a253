#pragma once
// zion in torch.profiler: a Kineto activity profiler registered for
// PrivateUse1 (torch's PrivateUse1ProfilerRegistry). A profiling session
// turns the modeled timeline's spans into device events: every priced op,
// copy and collective on its OAM and stream, at its modeled start and with
// its modeled duration, linked to the CPU op that issued it.

#include <cstddef>

namespace zion::device {

// The span cap the run asked the timeline to record with (0: not recording).
// A profiling session records spans only when nothing else is, and puts this
// cap back when it stops.
void note_span_recording(size_t max_spans);

}  // namespace zion::device

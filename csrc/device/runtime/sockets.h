#pragma once
// CPU sockets as places for work and memory. Inside zion_emu.socket(i) the
// CPU allocator places tensors in socket i's DDR pool, and CPU ops are
// charged on socket i's track of the timeline, priced by the platform's
// socket model (cores x FLOP/s, DDR bandwidth, gathers at DDR
// random-access efficiency). CPU ops run on the host: the host waits for them.

#include "sim/op_cost.h"

namespace zion::device {

// The timeline index of a socket's track: after the OAMs.
int socket_track(int socket);
// zion_emu.socket(i) on this thread (-1: none): CPU tensors go to socket i's
// DDR pool and the CPU ops the thread runs are charged to socket i.
void set_socket_scope(int socket);
// Charges one CPU op run under zion_emu.socket(socket).
void charge_socket_op(int socket, const sim::OpCall& call);
// Installs the CPU allocator that honours zion_emu.socket(i) (once; at load).
void install_socket_cpu_allocator();

}  // namespace zion::device

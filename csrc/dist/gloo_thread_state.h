#pragma once
// gloo's works capture the issuing thread's ThreadLocalState, and the last
// reference to a finished work may be dropped on gloo's own worker thread.
// The backward pass stashes a Python object in that state
// (torch.autograd.graph stashes the contextvars context for device
// threads), so dropping such a work takes the GIL. When the thread holding
// the GIL is the one destroying the gloo backend, which joins that worker,
// both wait for ever (seen with gloo DDP at teardown, torch 2.13). gloo's work has no use for
// those Python objects: the zion backend issues its gloo calls without them.

#include <ATen/ThreadLocalPythonObjects.h>

#include <utility>

namespace zion::dist {

class WithoutPythonObjectsInTls {
 public:
  WithoutPythonObjectsInTls() : saved_(at::impl::ThreadLocalPythonObjects::get_state()) {
    at::impl::ThreadLocalPythonObjects::set_state({});
  }
  ~WithoutPythonObjectsInTls() { at::impl::ThreadLocalPythonObjects::set_state(std::move(saved_)); }
  WithoutPythonObjectsInTls(const WithoutPythonObjectsInTls&) = delete;
  WithoutPythonObjectsInTls& operator=(const WithoutPythonObjectsInTls&) = delete;

 private:
  at::impl::ThreadLocalPythonObjects saved_;  // copies of shared_ptrs: no GIL needed
};

}  // namespace zion::dist

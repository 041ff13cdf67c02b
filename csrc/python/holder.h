// The pybind11 holder of qcomm's c10d::Backend subclasses (python/module.cpp, testing/testing.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace qcomm {

// torch binds c10d::Backend with a holder that drops the GIL in its destructor (the inner
// ProcessGroupNCCL joins threads when it dies). Ours must have the same single-pointer layout so
// that pybind can hand our object to torch as a Backend.
template <class T>
class NoGilPtr {
 public:
  NoGilPtr() = default;
  explicit NoGilPtr(T* p) : p_(c10::intrusive_ptr<T>::reclaim_copy(p)) {}
  NoGilPtr(c10::intrusive_ptr<T> p) : p_(std::move(p)) {}  // NOLINT(runtime/explicit)
  ~NoGilPtr() {
    if (p_ && PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      p_.reset();
    }
  }
  T* get() const { return p_.get(); }

 private:
  c10::intrusive_ptr<T> p_;
};

// A Python object torch bound as a c10d::Backend (or None: null).
inline c10::intrusive_ptr<c10d::Backend> backendOf(const pybind11::object& o) {
  if (o.is_none()) return {};
  return c10::intrusive_ptr<c10d::Backend>::reclaim_copy(o.cast<c10d::Backend*>());
}

}  // namespace qcomm

PYBIND11_DECLARE_HOLDER_TYPE(T, qcomm::NoGilPtr<T>, true);

// The qcomm._C._testing submodule: hooks for the tests and benchmarks, not a public API.
#pragma once

#include <pybind11/pybind11.h>

namespace qcomm {

// Registers every test hook in `testing`; backendBase is torch's c10d Backend class.
void registerTesting(pybind11::module& testing, pybind11::object backendBase);

}  // namespace qcomm

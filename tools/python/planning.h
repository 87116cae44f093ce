// The planning half of the Python module (partitioner/): models, plan search, plan
// checks and the cost model's per-layer numbers.
#pragma once

#include <pybind11/pybind11.h>

namespace baton::python {

void register_planning(pybind11::module_& m);

}  // namespace baton::python

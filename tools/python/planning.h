// The planning half of the Python module (partitioner/): models, plan search, plan
// checks and the cost model's per-layer numbers.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace baton::python {

// Numbers from Python: int, float and numpy's scalars (anything with __float__ or
// __index__, not str or bool). `what` names the argument or field in the InputError.
bool is_number(const pybind11::handle& h);
double number(const pybind11::handle& h, const std::string& what);
double finite_number(const pybind11::handle& h, const std::string& what);  // NaN, inf refused
int whole_number(const pybind11::handle& h, const std::string& what);      // an int's range

void register_planning(pybind11::module_& m);

}  // namespace baton::python

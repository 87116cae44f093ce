// The planning half of the Python module (partitioner/): models, plan search, plan
// checks and the cost model's per-layer numbers.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace baton::python {

// Numbers from Python: int, float and numpy's scalars (anything with __float__ or
// __index__, not str or bool). `what` names the argument or field in the InputError.
bool is_number(const pybind11::handle& h);
double number(const pybind11::handle& h, const std::string& what);
double finite_number(const pybind11::handle& h, const std::string& what);  // NaN, inf refused
int whole_number(const pybind11::handle& h, const std::string& what);      // an int's range

// A Python value as JSON: None, bool, int, float, str, lists, tuples and dicts of them, and
// numpy's scalars and arrays as the Python values they hold (integers stay exact integers,
// bools bools, strings strings). NaN and infinity are refused, `path` naming the value.
nlohmann::json to_json(const pybind11::handle& h, const std::string& path);

// A file path from Python: a str or an os.PathLike (pathlib.Path); nullopt otherwise.
std::optional<std::string> path_string(const pybind11::handle& h);

void register_planning(pybind11::module_& m);

}  // namespace baton::python

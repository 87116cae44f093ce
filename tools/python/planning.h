// The planning half of the Python module (partitioner/): models, plan search, plan
// checks and the cost model's per-layer numbers.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace baton::python {

// A bool of Python, NumPy (np.True_) or torch (a bool tensor): never a number or a count,
// though each converts to one (np.True_ had been read as 1 where True is refused).
bool is_boolean(const pybind11::handle& h);

// A count argument (ranks, micro-batches, samples, ...): an int as pybind11 takes one,
// but not a bool, which Python makes an int subclass (generate("1f1b", True, 8) had been
// 1 rank). A bool fails the overload: TypeError.
template <class T>
struct BasicCount {
  T value = 0;
  operator T() const { return value; }  // NOLINT(google-explicit-constructor)
};
using Count = BasicCount<int>;
using Count64 = BasicCount<int64_t>;
// A switch argument: True or False (Python's or NumPy's) only; pybind11's bool took None
// and 1 for False and True.
struct Flag {
  bool value = false;
  operator bool() const { return value; }  // NOLINT(google-explicit-constructor)
};

// Numbers from Python: int, float and numpy's scalars (anything with __float__ or
// __index__, not str or a bool). `what` names the argument or field in the InputError.
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
// The `path` argument of save and the loaders: an empty one is refused by name (it had
// been "cannot rename .tmp1.0 to : No such file or directory").
void need_path(const std::filesystem::path& path);

void register_planning(pybind11::module_& m);

}  // namespace baton::python

namespace pybind11::detail {
template <class T>
struct type_caster<baton::python::BasicCount<T>> {
  PYBIND11_TYPE_CASTER(baton::python::BasicCount<T>, const_name("int"));
  bool load(handle src, bool /*convert*/) {
    if (!src || baton::python::is_boolean(src)) return false;
    make_caster<T> inner;
    // Without conversion: an int or what has __index__ (numpy's ints). Converting had
    // taken __int__ too, so np.float32(4.5), Decimal("4.9") and Fraction(9, 2) were 4.
    if (!inner.load(src, false)) return false;
    value.value = cast_op<T>(inner);
    return true;
  }
  static handle cast(baton::python::BasicCount<T> c, return_value_policy, handle) {
    return PyLong_FromLongLong(c.value);
  }
};
template <>
struct type_caster<baton::python::Flag> {
  PYBIND11_TYPE_CASTER(baton::python::Flag, const_name("bool"));
  bool load(handle src, bool) {
    if (!src || !baton::python::is_boolean(src)) return false;
    // One value, not an array of them.
    if (hasattr(src, "ndim") && src.attr("ndim").cast<int>() != 0) return false;
    value.value = PyObject_IsTrue(src.ptr()) == 1;
    return true;
  }
  static handle cast(baton::python::Flag f, return_value_policy, handle) {
    return handle(f.value ? Py_True : Py_False).inc_ref();
  }
};
}  // namespace pybind11::detail

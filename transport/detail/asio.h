// Boost.Asio, as every file of transport/ includes it. Boost 1.74's Asio uses
// std::exchange without including <utility> under C++20, so that comes first.
#pragma once

// clang-format off
#include <utility>
#include <boost/asio.hpp>
// clang-format on

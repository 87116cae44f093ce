// The instruction sets baton's CPU kernels were compiled for (-march=BATON_ARCH) against
// the CPU running them: a binary built with -march=native and run on an older CPU stops
// here with their names instead of dying of SIGILL inside a kernel.
#pragma once

#include <string>
#include <vector>

namespace baton::tools {

// The build's features (CMake lists them from the compiler) this CPU lacks; empty on a
// CPU that has them all, or where the build targets no particular instruction set.
std::vector<std::string> missing_cpu_features();

// Throws RuntimeError naming the missing features and how to rebuild. Called before any
// kernel runs (the command's first line, the Python module's import).
void require_cpu_features();

}  // namespace baton::tools

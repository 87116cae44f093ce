# Compile options for baton's own code, and helpers to declare its libraries and tests.
add_library(baton_options INTERFACE)
target_include_directories(baton_options INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_options(baton_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wno-missing-field-initializers>
  # The kernels' `#pragma GCC ivdep` and GCC-only warning names are for GCC; clang (the
  # asan preset) ignores them.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wno-unknown-pragmas
    -Wno-unknown-warning-option>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${BATON_WERROR}>>:-Werror>)
if(BATON_SANITIZE)
  string(REPLACE ";" "," _san "${BATON_SANITIZE}")
  target_compile_options(baton_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(baton_options INTERFACE -fsanitize=${_san})
endif()
# BATON_FUZZ (clang only; the asan preset): libFuzzer's coverage instrumentation on all of
# baton's code, and the fuzz targets of tests/fuzz/.
option(BATON_FUZZ "Build the libFuzzer targets (clang)" OFF)
if(BATON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "BATON_FUZZ needs clang (the asan preset uses clang++-14)")
  endif()
  target_compile_options(baton_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
if(BATON_HAVE_CUDA)
  target_compile_definitions(baton_options INTERFACE BATON_HAVE_CUDA=1)
  # nvcc's own warnings are errors too; host-side warnings go through -Xcompiler.
  target_compile_options(baton_options INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr
      -Wno-deprecated-gpu-targets>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${BATON_WERROR}>>:-Werror=all-warnings>)
endif()
if(BATON_HAVE_NCCL)
  target_compile_definitions(baton_options INTERFACE BATON_HAVE_NCCL=1)
endif()

# baton_library(NAME SOURCES ... DEPS ...): one static library per top-level folder.
function(baton_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC baton_options ${ARG_DEPS})
endfunction()

# baton_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s]): a GoogleTest program
# whose tests ctest discovers one by one.
function(baton_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE baton_options ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(props TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    # gtest_discover_tests loses list-valued properties, so the labels travel as one
    # comma-joined label; the presets select tests with a regex on it.
    string(REPLACE ";" "," labels "${ARG_LABELS}")
    list(APPEND props LABELS "${labels}")
  endif()
  gtest_discover_tests(${name} PROPERTIES ${props} DISCOVERY_TIMEOUT 60)
endfunction()
include(GoogleTest)

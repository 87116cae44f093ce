# Compile options for baton's own code, and helpers to declare its libraries and tests.
# baton_options is for baton's own build only (warnings, sanitizers, the backends'
# macros); the installed libraries do not carry it (BatonInstall.cmake).
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
# In a unity build a .cpp is an included file, so GCC's -Wsubobject-linkage (meant for a
# class in a header using a type of an anonymous namespace) fires for every GoogleTest
# fixture and pimpl of an anonymous-namespace type; the batch is still one translation
# unit, so nothing it warns about can happen.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_UNITY_BUILD)
  target_compile_options(baton_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
endif()
# GCC 12 at -O3 (the Release build type) reports a false -Wrestrict in libstdc++'s
# char_traits::copy for every `"literal" + std::string(...)` (operator+(const char*,
# string&&), which inserts at the front): GCC PR 105651 (and PR 105329 for the
# 1-character assignment). A dozen of baton's files use the pattern, correctly; the
# option is limited to GCC 12 and older (Debian 12 has 12.2).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(baton_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
# lld where the toolchain has it (Debian's lld): ld.bfd spent seconds per program on the
# sanitizer builds' static libraries and debug info, lld a fraction of that. Only links
# driven by the C++ compiler (nvcc's are left alone).
include(CheckLinkerFlag)
check_linker_flag(CXX -fuse-ld=lld BATON_HAVE_LLD)
if(BATON_HAVE_LLD)
  target_link_options(baton_options INTERFACE $<$<LINK_LANGUAGE:CXX>:-fuse-ld=lld>)
endif()
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

# baton_library(NAME SOURCES ... DEPS ...): one static library per top-level folder,
# installed and exported as baton::<NAME without baton_> (BatonInstall.cmake) with the
# public headers of its folder.
function(baton_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC $<BUILD_INTERFACE:baton_options> ${ARG_DEPS})
  baton_install_library(${name})
endfunction()

# tests_asan, tests_tsan: the programs of the tests a sanitizer preset runs (its build
# preset builds only these and what they link, not the whole tree).
foreach(_label asan tsan)
  add_custom_target(tests_${_label})
endforeach()
# baton_label_target(TARGET LABELS ...): TARGET is built by the presets of its labels.
function(baton_label_target target)
  foreach(label IN LISTS ARGN)
    if(TARGET tests_${label})
      add_dependencies(tests_${label} ${target})
    endif()
  endforeach()
endfunction()

# baton_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s]): a GoogleTest program
# whose tests ctest discovers one by one.
function(baton_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE baton_options ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  # A test's own code at -O1 in the optimised builds: what it tests is the libraries
  # (still -O3), and at -O3 the test programs were 43% of the release build's CPU.
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release,RelWithDebInfo>:-O1>)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(props TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    # gtest_discover_tests loses list-valued properties, so the labels travel as one
    # comma-joined label; the presets select tests with a regex on it.
    string(REPLACE ";" "," labels "${ARG_LABELS}")
    list(APPEND props LABELS "${labels}")
    baton_label_target(${name} ${ARG_LABELS})
  endif()
  list(APPEND props ENVIRONMENT TMPDIR=${BATON_TEST_TMPDIR} FIXTURES_REQUIRED baton_test_tmpdir)
  gtest_discover_tests(${name} PROPERTIES ${props} DISCOVERY_TIMEOUT 60)
endfunction()
# baton_scratch_tests(): the tests added so far with add_test in the calling folder write
# their scratch files under the suite's $TMPDIR too (see tests/CMakeLists.txt).
function(baton_scratch_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  list(REMOVE_ITEM tests test_tmpdir)
  foreach(t IN LISTS tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT TMPDIR=${BATON_TEST_TMPDIR})
    set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED baton_test_tmpdir)
  endforeach()
endfunction()
include(GoogleTest)

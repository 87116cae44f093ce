# The `consumer_install` test (cmake -P): installs the build folder BUILD_DIR into a
# fresh prefix under WORK_DIR, checks the layout (the command runs from there; no
# private header was installed that no public one needs), then configures, builds and
# runs this folder's project against the prefix only.
foreach(v BUILD_DIR WORK_DIR SOURCE_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake: -D${v}= is required")
  endif()
endforeach()
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "consumer: `${cmd}` failed (${rc})")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")

# The layout (docs/development.md, "Installing and packaging").
foreach(f bin/baton include/baton/schedule/simulate.h include/baton/transport/local.h
    share/baton/examples share/doc/baton/README.md)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "consumer: ${f} was not installed")
  endif()
endforeach()
file(GLOB_RECURSE config "${prefix}/*/batonConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "consumer: no batonConfig.cmake under ${prefix}")
endif()
file(GLOB_RECURSE private RELATIVE "${prefix}/include/baton" "${prefix}/include/baton/*/detail/*.h")
foreach(h IN LISTS private)
  # Installed only because a public header includes it (cmake/BatonPackage.cmake).
  file(GLOB_RECURSE users "${prefix}/include/baton/*.h")
  set(needed OFF)
  foreach(u IN LISTS users)
    file(STRINGS "${u}" hit REGEX "#include \"${h}\"")
    if(hit)
      set(needed ON)
    endif()
  endforeach()
  if(NOT needed)
    message(FATAL_ERROR "consumer: include/baton/${h} is private and installed")
  endif()
endforeach()
run("${prefix}/bin/baton" version)

# The project, against the prefix only: no package registry, no other baton.
set(launcher)
if(CXX_LAUNCHER)
  set(launcher "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER}")
endif()
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" ${launcher}
  "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" dir REGEX "^baton_DIR:")
if(NOT dir MATCHES "${prefix}/")
  message(FATAL_ERROR "consumer: found baton elsewhere than ${prefix}: ${dir}")
endif()
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")

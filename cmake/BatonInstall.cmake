# Install rules for baton's libraries and the hooks other folders call; the layout, the
# CMake package and the Debian package are made at the end (BatonPackage.cmake).
# docs/development.md, "Installing and packaging", describes the result.
#
# Two install components: `runtime` (the command, the Python module, examples, docs)
# and `dev` (static libraries, public headers, the CMake package). `cmake --install`
# installs both; cpack makes one Debian package of each (baton, baton-dev).
include(GNUInstallDirs)
set(BATON_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/baton")
set(BATON_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/baton" CACHE STRING
  "Where batonConfig.cmake is installed, relative to the prefix")
# Debian's python3 reads /usr/lib/python3/dist-packages; for another prefix, add
# <prefix>/lib/python3/dist-packages to PYTHONPATH or set this.
set(BATON_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
  "Where the Python module is installed, relative to the prefix")
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr" AND BATON_INSTALL_PYTHONDIR STREQUAL "lib/python3/dist-packages")
  message(STATUS "baton: `cmake --install` puts the Python module in "
    "${CMAKE_INSTALL_PREFIX}/lib/python3/dist-packages, which python3 reads only under /usr: "
    "add it to PYTHONPATH (or set BATON_INSTALL_PYTHONDIR, e.g. lib/python3.11/dist-packages "
    "for /usr/local)")
endif()

# baton_install_library(NAME): called by baton_library(). Installs the static library
# under the export name baton::<NAME without baton_> (also an alias in the build tree),
# the public headers of its top-level folder (include/baton/<folder>/*.h, included as
# "<folder>/x.h" like inside the tree; detail/ and backend subfolders such as
# kernels/cuda/ stay private unless a public header includes them: BatonPackage.cmake)
# and adds it to baton::baton. Libraries of tests/, bench/ and tools/ are not installed.
function(baton_install_library name)
  file(RELATIVE_PATH folder "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}")
  string(REGEX REPLACE "/.*" "" top "${folder}")
  if(BATON_GPU_CHECK OR top MATCHES "^(tests|bench|tools|examples)$")
    return()
  endif()
  string(REGEX REPLACE "^baton_" "" export_name "${name}")
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export_name})
  add_library(baton::${export_name} ALIAS ${name})
  target_include_directories(${name} INTERFACE $<INSTALL_INTERFACE:${BATON_INSTALL_INCLUDEDIR}>)
  install(TARGETS ${name} EXPORT batonTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  set_property(GLOBAL APPEND PROPERTY BATON_LIBRARIES ${name})
  if(folder MATCHES "^[A-Za-z0-9_]+$")
    set_property(GLOBAL APPEND PROPERTY BATON_HEADER_FOLDERS ${folder})
  endif()
endfunction()

# baton_install_python_module(TARGET [SUBDIR package] [FILES file.py ...]): installs a
# Python extension module (a pybind11_add_module() target) and any pure-Python files
# beside it into BATON_INSTALL_PYTHONDIR[/package], in the runtime component (so in the
# baton Debian package).
function(baton_install_python_module target)
  cmake_parse_arguments(ARG "" "SUBDIR" "FILES" ${ARGN})
  set(dest "${BATON_INSTALL_PYTHONDIR}")
  if(ARG_SUBDIR)
    string(APPEND dest "/${ARG_SUBDIR}")
  endif()
  # As the command: the folders of its other libraries (CUDA, OpenBLAS's OpenMP build)
  # stay on its RUNPATH, or the installed module loads another OpenBLAS or none.
  set_target_properties(${target} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${target} LIBRARY DESTINATION "${dest}" COMPONENT runtime)
  if(ARG_FILES)
    install(FILES ${ARG_FILES} DESTINATION "${dest}" COMPONENT runtime)
  endif()
endfunction()

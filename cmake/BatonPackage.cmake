# The end of the top-level CMakeLists.txt: baton::baton, the install layout, the CMake
# package (find_package(baton CONFIG)) and the Debian packages (cpack -G DEB). The
# libraries registered themselves through baton_library() (BatonInstall.cmake).
include(CMakePackageConfigHelpers)

# baton::baton: every installed library.
get_property(_baton_libraries GLOBAL PROPERTY BATON_LIBRARIES)
add_library(baton_umbrella INTERFACE)
set_target_properties(baton_umbrella PROPERTIES EXPORT_NAME baton)
target_link_libraries(baton_umbrella INTERFACE ${_baton_libraries})
add_library(baton::baton ALIAS baton_umbrella)
install(TARGETS baton_umbrella EXPORT batonTargets COMPONENT dev)

# Public headers: the top-level *.h of each library's folder, then whatever those
# include from baton's subfolders (a detail/ header a public one needs), transitively.
get_property(_baton_header_folders GLOBAL PROPERTY BATON_HEADER_FOLDERS)
list(REMOVE_DUPLICATES _baton_header_folders)
set(_baton_headers)
foreach(_folder IN LISTS _baton_header_folders)
  file(GLOB _h CONFIGURE_DEPENDS RELATIVE "${PROJECT_SOURCE_DIR}" "${PROJECT_SOURCE_DIR}/${_folder}/*.h")
  list(APPEND _baton_headers ${_h})
endforeach()
# A build without CUDA installs no header that includes CUDA's or NCCL's (one had been
# installed that a consumer without the toolkit could not compile).
if(NOT BATON_HAVE_CUDA)
  foreach(_h IN LISTS _baton_headers)
    file(STRINGS "${PROJECT_SOURCE_DIR}/${_h}" _cuda REGEX "^[ \t]*#[ \t]*include[ \t]+<(cuda|cublas|cudnn|nccl)")
    if(_cuda)
      list(REMOVE_ITEM _baton_headers "${_h}")
    endif()
  endforeach()
endif()
set(_todo ${_baton_headers})
while(_todo)
  list(POP_FRONT _todo _h)
  file(STRINGS "${PROJECT_SOURCE_DIR}/${_h}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"[^\"]+\"")
  foreach(_line IN LISTS _includes)
    string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*" "\\1" _inc "${_line}")
    if(EXISTS "${PROJECT_SOURCE_DIR}/${_inc}" AND NOT _inc IN_LIST _baton_headers)
      list(APPEND _baton_headers "${_inc}")
      list(APPEND _todo "${_inc}")
    endif()
  endforeach()
endwhile()
foreach(_h IN LISTS _baton_headers)
  cmake_path(GET _h PARENT_PATH _dir)
  install(FILES "${_h}" DESTINATION "${BATON_INSTALL_INCLUDEDIR}/${_dir}" COMPONENT dev)
endforeach()

# The command. Its libraries other than baton's own (UCX, OpenBLAS, CUDA, ...) come
# from the link path; folders outside the system's stay on its install RPATH.
set_target_properties(baton PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS baton RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/examples/"
  DESTINATION "${CMAKE_INSTALL_DATADIR}/baton/examples" COMPONENT runtime)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT runtime)
install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT runtime)

# The CMake package: targets, version (0.x: a new minor version may break), and the
# dependencies found again as baton's build found them (baton_find_package()).
get_property(_baton_deps GLOBAL PROPERTY BATON_EXPORT_DEPENDENCIES)
list(REMOVE_DUPLICATES _baton_deps)
list(JOIN _baton_deps "\n" BATON_CONFIG_DEPENDENCIES)
configure_package_config_file(cmake/batonConfig.cmake.in
  "${PROJECT_BINARY_DIR}/batonConfig.cmake" INSTALL_DESTINATION "${BATON_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(EXPORT batonTargets NAMESPACE baton:: DESTINATION "${BATON_INSTALL_CMAKEDIR}" COMPONENT dev)
install(FILES "${PROJECT_BINARY_DIR}/batonConfig.cmake" "${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
  cmake/FindBatonOpenBLAS.cmake cmake/FindBatonNCCL.cmake
  DESTINATION "${BATON_INSTALL_CMAKEDIR}" COMPONENT dev)

# Debian packages: `cpack -G DEB` in the build folder makes baton_<version>_<arch>.deb
# (the runtime component; its Depends from dpkg-shlibdeps on the command) and
# baton-dev_<version>_<arch>.deb (libraries, headers, CMake package; Depends on baton
# and the -dev packages that find_package(baton) needs).
set(BATON_PACKAGE_MAINTAINER "baton maintainers <maintainers@users.noreply.a-seed-5922868b.example>"
  CACHE STRING "Maintainer field of the Debian packages")
set(CPACK_PACKAGE_NAME baton)
set(CPACK_PACKAGE_VENDOR "baton")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${BATON_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${BATON_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME baton)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps names libopenblas0, which the pthread build alone satisfies; the command's
# RUNPATH asks for the variant it was built with. The Python module needs its Python and
# numpy, which shlibdeps cannot see.
set(_runtime_depends)
if(BATON_BLAS_VARIANT STREQUAL "openmp")
  list(APPEND _runtime_depends libopenblas0-openmp)
else()
  list(APPEND _runtime_depends libopenblas0-pthread)
endif()
get_property(_python GLOBAL PROPERTY BATON_PYTHON_MINOR_VERSION)
if(_python)
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\1" _major "${_python}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\2" _minor "${_python}")
  math(EXPR _next "${_minor} + 1")
  list(APPEND _runtime_depends "python3 (>= ${_python})" "python3 (<< ${_major}.${_next})" python3-numpy)
endif()
list(JOIN _runtime_depends ", " CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "pipeline- and model-parallel training engine\nThe baton command: trains models split into pipeline stages and tensor-parallel\nshards over UCX (CPU) or NCCL (CUDA), and simulates and validates pipeline schedules.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME baton-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION
  "pipeline- and model-parallel training engine (development files)\nbaton's static libraries, public headers and CMake package: find_package(baton CONFIG)\nand link baton::baton or one folder's library (baton::schedule, baton::transport, ...).")
set(_dev_depends "baton (= ${PROJECT_VERSION})" "nlohmann-json3-dev (>= 3.10)" libspdlog-dev libfmt-dev
  "libboost-dev (>= 1.74)" libboost-program-options-dev zlib1g-dev)
# From the dependencies batonConfig.cmake finds again: DNNL::dnnl, an imported target of
# kernels/, is not visible here (the test had been always false, and baton-dev lacked
# libdnnl-dev while its config called find_dependency(dnnl)). Debian's oneDNN config
# requires OpenCL's headers, which libdnnl-dev only recommends.
if(_baton_deps MATCHES "find_dependency\\(dnnl")
  list(APPEND _dev_depends libdnnl-dev)
  if(dnnl_DIR AND EXISTS "${dnnl_DIR}/dnnl-config.cmake")
    file(STRINGS "${dnnl_DIR}/dnnl-config.cmake" _dnnl_opencl REGEX "find_package\\(OpenCL")
    if(_dnnl_opencl)
      list(APPEND _dev_depends ocl-icd-opencl-dev)
    endif()
  endif()
endif()
if(BATON_BLAS_VARIANT STREQUAL "openmp")
  list(APPEND _dev_depends libopenblas-openmp-dev)
else()
  list(APPEND _dev_depends libopenblas-pthread-dev)
endif()
if(BATON_WITH_UCX)
  list(APPEND _dev_depends libucx-dev)
endif()
list(JOIN _dev_depends ", " CPACK_DEBIAN_DEV_PACKAGE_DEPENDS)
if(BATON_HAVE_CUDA)
  # The CUDA toolkit and NCCL are not Debian packages here: dpkg-shlibdeps finds no
  # package for them, so their folders are the package's private ones.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR})
  if(BATON_NCCL_LIB)
    cmake_path(GET BATON_NCCL_LIB PARENT_PATH _nccl_dir)
    list(APPEND CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_nccl_dir})
  endif()
  list(REMOVE_DUPLICATES CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS)
endif()
include(CPack)

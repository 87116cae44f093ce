# baton_version_header(TARGET SOURCE): generates tools/version.h (the version from
# project() and the git commit of the source tree, "unknown" outside a git checkout)
# into the build folder at every build, rewriting it only when its text changes, and
# lets only SOURCE of TARGET include it: a new commit recompiles that one file.
find_package(Git QUIET)
function(baton_version_header target source)
  set(dir "${PROJECT_BINARY_DIR}/generated")
  set(header "${dir}/tools/version.h")
  add_custom_target(baton_version_header
    COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUTPUT=${header}
            -DVERSION=${PROJECT_VERSION} -DGIT=${GIT_EXECUTABLE}
            -P "${PROJECT_SOURCE_DIR}/cmake/BatonWriteVersion.cmake"
    BYPRODUCTS "${header}"
    COMMENT "" VERBATIM)
  add_dependencies(${target} baton_version_header)
  set_source_files_properties(${source} PROPERTIES INCLUDE_DIRECTORIES "${dir}")
endfunction()

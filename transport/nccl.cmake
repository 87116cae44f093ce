# The NCCL backend's library (a stub that says so when built without NCCL); included by
# transport/CMakeLists.txt and by the GPU-check build.
baton_library(baton_transport_nccl
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator.cpp ${CMAKE_CURRENT_LIST_DIR}/detail/nccl_watchdog.cpp
          ${CMAKE_CURRENT_LIST_DIR}/detail/nccl_rendezvous.cpp
  DEPS baton_memory Threads::Threads)
if(BATON_HAVE_NCCL)
  target_link_libraries(baton_transport_nccl PUBLIC baton_nccl)
endif()

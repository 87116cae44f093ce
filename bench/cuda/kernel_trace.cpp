// libbaton_kernel_trace.so: the GPU's own timeline of any CUDA program, through CUPTI's
// activity records, for machines without Nsight Systems (the lent H200 has none). Loaded
// with LD_PRELOAD; BATON_KERNEL_TRACE names the CSV it writes:
//
//   BATON_KERNEL_TRACE=k.csv LD_PRELOAD=libbaton_kernel_trace.so baton train ...
//   python3 bench/cuda/kernel_trace_summary.py k.csv
//
// One row per kernel, copy, memset and host synchronization: kind, stream, start and end
// (ns, the GPU's clock), bytes, the demangled name. CUPTI fills buffers asynchronously;
// they are written as they complete and flushed when the program exits.
#include <cupti.h>
#include <cxxabi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace {

std::mutex g_mu;
FILE* g_out = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "baton kernel trace: %s: %s\n", what, msg != nullptr ? msg : "?");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                           std::free);
  std::string s = status == 0 && d ? d.get() : name;
  // The CSV's last column: no quotes or newlines inside.
  for (char& c : s)
    if (c == '"' || c == '\n') c = ' ';
  return s;
}

void row(const char* kind, uint32_t stream, uint64_t start, uint64_t end, uint64_t bytes,
         const std::string& name) {
  std::fprintf(g_out, "%s,%u,%llu,%llu,%llu,\"%s\"\n", kind, stream,
               static_cast<unsigned long long>(start), static_cast<unsigned long long>(end),
               static_cast<unsigned long long>(bytes), name.c_str());
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity* rec = nullptr;
    while (g_out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          row("kernel", k->streamId, k->start, k->end, 0, demangled(k->name));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          static const char* kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                        "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
          const unsigned ck = m->copyKind < 11 ? m->copyKind : 0;
          row("memcpy", m->streamId, m->start, m->end, m->bytes, kinds[ck]);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          row("memset", m->streamId, m->start, m->end, m->bytes, "memset");
          break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
          const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(rec);
          static const char* kinds[] = {"unknown", "event", "stream wait event", "stream",
                                        "context"};
          const unsigned t = s->type < 5 ? unsigned(s->type) : 0;
          row("sync", s->streamId, s->start, s->end, 0, kinds[t]);
          break;
        }
        default:
          break;
      }
    }
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out != nullptr) std::fclose(g_out);
  g_out = nullptr;
}

__attribute__((constructor)) void start() {
  const char* path = std::getenv("BATON_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') return;
  g_out = std::fopen(path, "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "baton kernel trace: cannot write %s: %s\n", path, std::strerror(errno));
    return;
  }
  std::fprintf(g_out, "kind,stream,start_ns,end_ns,bytes,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION})
    check(cuptiActivityEnable(k), "enable");
  std::atexit(finish);
}

}  // namespace

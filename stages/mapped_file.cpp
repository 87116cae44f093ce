#include "stages/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "memory/error.h"
#include "memory/file_io.h"

namespace baton::stages {

namespace {
// ---- the registry of mappings and the SIGBUS handler ----
//
// A signal handler may neither allocate nor lock, so the registry is a fixed array of slots
// updated with atomics: a slot is claimed (free -> busy), filled, then published (ready); the
// handler reads only ready slots. A mapping beyond the slots goes unregistered: its fault
// reaches the previous handler, as before.
constexpr int kMappingSlots = 256;
constexpr size_t kMappingPathBytes = 1024;  // a longer path is shown cut
enum : int { kSlotFree = 0, kSlotBusy = 1, kSlotReady = 2 };
struct MappingSlot {
  std::atomic<int> state{kSlotFree};
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<size_t> size{0};
  char path[kMappingPathBytes] = {};
};
MappingSlot g_mappings[kMappingSlots];
struct sigaction g_previous_sigbus {};

// Appends to a fixed buffer without allocating (the handler's only formatting).
struct SignalLine {
  char buf[kMappingPathBytes + 512];
  size_t n = 0;
  SignalLine& operator<<(const char* s) {
    while (*s != '\0' && n < sizeof buf) buf[n++] = *s++;
    return *this;
  }
  SignalLine& operator<<(uint64_t v) {
    char digits[24];
    int k = 0;
    do digits[k++] = char('0' + v % 10);
    while ((v /= 10) != 0);
    while (k > 0 && n < sizeof buf) buf[n++] = digits[--k];
    return *this;
  }
};

[[noreturn]] void report_fault(const MappingSlot& slot, uintptr_t addr) {
  const uint64_t at = addr - slot.begin.load(std::memory_order_relaxed);
  const uint64_t was = slot.size.load(std::memory_order_relaxed);
  SignalLine line;
  line << "baton: failed: " << slot.path;
  struct stat st {};
  const bool known = ::stat(slot.path, &st) == 0;
  // A fault below the file's present size was no truncation (or the file grew back since):
  // an I/O error under the mapping, such as a network file system's.
  if (known && uint64_t(st.st_size) > at)
    line << ": reading byte " << at << " of its mapping failed (was " << was << " bytes, now "
         << uint64_t(st.st_size) << "; rewritten while mapped, or an I/O error)";
  else if (known)
    line << " shrank while it was mapped (was " << was << " bytes, now " << uint64_t(st.st_size)
         << ")";
  else
    line << " shrank or went away while it was mapped (was " << was << " bytes)";
  line << ": a file given to baton must not be rewritten while the run reads it; resume from "
          "the last checkpoint\n";
  for (size_t off = 0; off < line.n;) {
    const ssize_t w = ::write(STDERR_FILENO, line.buf + off, line.n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += size_t(w);
  }
  ::_exit(1);
}

// What the previous disposition would have done with this signal.
void forward_to_previous(int sig, siginfo_t* info, void* context) {
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous_sigbus.sa_sigaction != nullptr)
      g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  // An ignored SIGBUS sent by kill stays ignored; a fault cannot be ignored (returning would
  // retry the read for ever), so it takes the default action, as the kernel would.
  if (g_previous_sigbus.sa_handler == SIG_IGN && info->si_code <= 0) return;
  if (g_previous_sigbus.sa_handler == SIG_DFL || g_previous_sigbus.sa_handler == SIG_IGN) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);  // pending until this handler returns, then the default action
    return;
  }
  g_previous_sigbus.sa_handler(sig);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  // si_addr is the faulting address only for a signal the kernel raised (si_code > 0).
  if (info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (const MappingSlot& slot : g_mappings)
      if (slot.state.load(std::memory_order_acquire) == kSlotReady &&
          addr >= slot.begin.load(std::memory_order_relaxed) &&
          addr < slot.end.load(std::memory_order_relaxed))
        report_fault(slot, addr);
  }
  forward_to_previous(sig, info, context);
}

// Once per process, at the first mapping: libraries that install their own SIGBUS handler at
// load time (UCX) have done so by then, and are chained to.
void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;  // not SA_ONSTACK: an alternate stack may be too small for SignalLine
  ::sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGBUS, &sa, &g_previous_sigbus) != 0) {
    spdlog::debug("cannot install the SIGBUS handler for mapped files: {}", std::strerror(errno));
    return;
  }
  // Some libraries refuse other handlers for the signals they handle (UCX's sigaction
  // override when its error handling is on): a truncated input then crashes through theirs.
  struct sigaction now {};
  if (::sigaction(SIGBUS, nullptr, &now) == 0 && now.sa_sigaction != on_sigbus)
    spdlog::debug(
        "another library kept its SIGBUS handler: a mapped file truncated during the "
        "run is reported by it");
}

int register_mapping(const unsigned char* data, size_t size, const std::string& path) {
  static const bool installed = (install_handler(), true);
  (void)installed;
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t pg = page > 0 ? size_t(page) : 4096;
  for (int i = 0; i < kMappingSlots; ++i) {
    MappingSlot& slot = g_mappings[i];
    int expected = kSlotFree;
    if (!slot.state.compare_exchange_strong(expected, kSlotBusy, std::memory_order_acquire))
      continue;
    const auto begin = reinterpret_cast<uintptr_t>(data);
    slot.begin.store(begin, std::memory_order_relaxed);
    // The mapping covers whole pages: a fault in the last page's tail is this file's too.
    slot.end.store(begin + (size + pg - 1) / pg * pg, std::memory_order_relaxed);
    slot.size.store(size, std::memory_order_relaxed);
    const size_t n = std::min(path.size(), kMappingPathBytes - 1);
    std::memcpy(slot.path, path.data(), n);
    slot.path[n] = '\0';
    slot.state.store(kSlotReady, std::memory_order_release);
    return i;
  }
  spdlog::debug("{}: more than {} files mapped at once: a truncation of it is not named", path,
                kMappingSlots);
  return -1;
}

// Before the munmap: the address range may be reused by the next mapping.
void unregister_mapping(int i) {
  if (i < 0) return;
  g_mappings[i].state.store(kSlotBusy, std::memory_order_relaxed);
  g_mappings[i].begin.store(0, std::memory_order_relaxed);
  g_mappings[i].end.store(0, std::memory_order_relaxed);
  g_mappings[i].state.store(kSlotFree, std::memory_order_release);
}
}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // Opened without blocking on a FIFO, which is refused (a run that hung for ever).
  int fd = memory::open_regular_file(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(path + ": cannot open file: " + std::strerror(err));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw InputError(path + ": cannot map file: " + std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
    slot_ = register_mapping(data_, size_, path_);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      slot_(std::exchange(o.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

void MappedFile::release() {
  unregister_mapping(std::exchange(slot_, -1));
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace baton::stages

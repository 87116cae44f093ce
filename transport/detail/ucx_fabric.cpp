#include "transport/detail/ucx_fabric.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>

#include "transport/collective_memory.h"
#include "transport/detail/asio.h"
#include "transport/detail/tag.h"
#include "transport/detail/ucx_check.h"
#include "transport/world.h"

namespace baton::transport::detail {

namespace {

namespace asio = boost::asio;
using asio::ip::udp;

// Liveness protocol message kinds: pings, pongs and notices by UDP, goodbyes on UCX (in
// the control context, after the data they follow), or by UDP to a peer this rank never
// sent to (no endpoint: no data to follow; a peer waiting on it had heard nothing and
// blamed a hang after the peer timeout).
constexpr uint64_t kPing = 1;
constexpr uint64_t kPong = 2;
constexpr uint64_t kNotice = 3;  // payload: failed rank (4 bytes) and the reason
constexpr uint64_t kBye = 4;     // the sender is closing its communicator; payload as a
                                 // notice: the failure that made it leave, or rank -1
constexpr size_t kControlBytes = 512;

// The coarse monotonic clock (a few ns to read, millisecond resolution): liveness and
// the progress thread's naps need no more, and it is read on every message.
int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

char g_zero_byte = 0;  // a valid address for empty messages

// BATON_UCX_ERR_MODE: auto (peer-failure mode across hosts only), peer, or none.
std::string err_mode_setting() {
  const char* v = std::getenv("BATON_UCX_ERR_MODE");
  std::string m = v && *v ? v : "auto";
  if (m != "auto" && m != "peer" && m != "none")
    throw InputError("BATON_UCX_ERR_MODE='" + m + "': expected auto, peer or none");
  return m;
}

// Of the network devices UCX_NET_DEVICES names, those that exist here but are down (not
// up and running); empty when any named device is usable, or one is not a network
// interface of this host (an InfiniBand port, "all", a name UCX itself will refuse).
std::vector<std::string> net_devices_down() {
  const char* v = std::getenv("UCX_NET_DEVICES");
  if (v == nullptr || *v == '\0') return {};
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  std::vector<std::string> down;
  std::string list = v;
  bool usable = false;
  for (size_t at = 0; at <= list.size() && !usable;) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    std::string name = list.substr(at, comma - at);
    at = comma + 1;
    ifreq ifr{};
    if (name.empty() || name.size() >= sizeof ifr.ifr_name || name.find(':') != std::string::npos) {
      usable = true;
      break;
    }
    std::memcpy(ifr.ifr_name, name.data(), name.size());
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0 ||
        (ifr.ifr_flags & IFF_UP && ifr.ifr_flags & IFF_RUNNING))
      usable = true;
    else
      down.push_back(name);
  }
  ::close(fd);
  return usable ? std::vector<std::string>{} : down;
}

// UCX refuses to start when every device UCX_NET_DEVICES names is down ("no usable
// transports"): a rank restarted after a link cut would fail at once, again and again,
// while the link is still down, and its restarts would be spent before it came back.
// Start-up waits for the other ranks up to the connect timeout; it waits for its network
// the same way (a device that does not exist still fails at once, in UCX).
void wait_for_net_devices(std::chrono::milliseconds timeout, int rank) {
  std::vector<std::string> down = net_devices_down();
  if (down.empty()) return;
  std::string names;
  for (auto& d : down) names += (names.empty() ? "" : ", ") + d;
  spdlog::warn("ucx: rank {}: network device(s) {} (UCX_NET_DEVICES) down; waiting up to {} s",
               rank, names, timeout.count() / 1000.0);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!net_devices_down().empty()) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw RuntimeError("ucx: rank " + std::to_string(rank) + ": network device(s) " + names +
                         " (UCX_NET_DEVICES) still down after " + std::to_string(timeout.count()) +
                         " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  spdlog::info("ucx: rank {}: network device(s) {} up", rank, names);
}

// The error of a rendezvous that timed out: which ranks never published their address
// (asked one by one, without waiting), or the store's own error when it cannot say.
std::string missing_peers(Store& store, const std::string& prefix, int rank, int size,
                          std::chrono::milliseconds timeout, const RuntimeError& error) {
  std::vector<int> missing;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    try {
      store.get(prefix + "/ucx/" + std::to_string(p), std::chrono::milliseconds(0));
    } catch (const RuntimeError& e) {
      if (std::string(e.what()).find("timed out waiting for") == std::string::npos)
        return error.what();  // the store itself failed
      missing.push_back(p);
    }
  }
  if (missing.empty()) return error.what();
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i)
    list += (i == 0 ? "" : i + 1 == missing.size() ? " and " : ", ") + std::to_string(missing[i]);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", double(timeout.count()) / 1000.0);
  return "rank " + std::to_string(rank) + ": rank" + (missing.size() > 1 ? "s " : " ") + list +
         " of " + std::to_string(size) + " did not reach the rendezvous within " + secs +
         " s (BATON_CONNECT_TIMEOUT): not started, or their host cannot reach the rendezvous's";
}

}  // namespace

struct UcxFabric::Control {
  UcxFabric* fabric;
  uint64_t kind;
  void* request = nullptr;  // the posted receive while it waits
  bool fired = false;       // its callback ran
  char buf[kControlBytes];
};

// A datagram: the receiver's nonce (it published it with its address: datagrams from
// strangers or from an earlier run of the job are dropped), the kind, the sender's rank,
// then the payload.
struct DatagramHeader {
  uint64_t nonce;
  uint32_t kind;
  int32_t sender;
};

struct UcxFabric::ControlSocket {
  asio::io_context io;
  udp::socket socket{io};
  uint64_t nonce = 0;
  std::vector<udp::endpoint> peers;  // where each rank listens
  std::vector<uint64_t> peer_nonces;
  std::vector<char> buf = std::vector<char>(sizeof(DatagramHeader) + kControlBytes);

  // Bound to every address of this host, on a port the system picks.
  explicit ControlSocket(const asio::ip::address& family, size_t size)
      : peers(size), peer_nonces(size) {
    std::random_device rd;
    nonce = uint64_t(rd()) << 32 | rd();
    udp proto = family.is_v6() ? udp::v6() : udp::v4();
    socket.open(proto);
    socket.bind(udp::endpoint(proto, 0));
    socket.non_blocking(true);
  }

  // "<nonce> <port> <address>...": the address the store sees first, then this host's
  // other addresses of the same family that are up, for a store reached by loopback.
  std::string describe(const asio::ip::address& seen) const {
    std::string out = std::to_string(nonce) + ' ' + std::to_string(socket.local_endpoint().port());
    std::vector<std::string> all{seen.to_string()};
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      for (ifaddrs* i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        char text[64] = {};
        int fam = i->ifa_addr->sa_family;
        if (fam != (seen.is_v6() ? AF_INET6 : AF_INET)) continue;
        const void* a =
            fam == AF_INET
                ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
                : static_cast<const void*>(
                      &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
        if (inet_ntop(fam, a, text, sizeof text)) all.emplace_back(text);
      }
      freeifaddrs(list);
    }
    for (auto& a : all) out += ' ' + a;
    return out;
  }

  // Reads a peer's description; on its host, the loopback address.
  bool learn(int peer, const std::string& text, bool same_host) {
    std::istringstream in(text);
    uint64_t n = 0;
    unsigned port = 0;
    if (!(in >> n >> port) || port == 0 || port > 65535) return false;
    std::string a;
    std::optional<asio::ip::address> pick;
    boost::system::error_code ec;
    while (in >> a) {
      auto addr = asio::ip::make_address(a, ec);
      if (ec) return false;
      if (!pick || (pick->is_loopback() && !addr.is_loopback())) pick = addr;
    }
    if (!pick) return false;
    if (same_host)
      pick = pick->is_v6() ? asio::ip::address(asio::ip::address_v6::loopback())
                           : asio::ip::address(asio::ip::address_v4::loopback());
    peers[size_t(peer)] = udp::endpoint(*pick, uint16_t(port));
    peer_nonces[size_t(peer)] = n;
    return true;
  }
};

// ---- set-up and tear-down ----

UcxFabric::UcxFabric(int rank, int size, Store& store, const std::string& prefix,
                     CommOptions options, const std::string& host_label)
    : Fabric(rank, size, options),
      addresses_(size_t(size)),
      hosts_(size_t(size)),
      eps_(size_t(size), nullptr),
      ep_args_(size_t(size)),
      ep_dead_(size_t(size), false),
      peer_mode_(size_t(size), false),
      pending_per_peer_(size_t(size), 0),
      peers_(size_t(size)) {
  wait_for_net_devices(options.connect_timeout, rank);
  ucp_config_t* config = nullptr;
  // An empty UCX_RNDV_THRESH is unset, as baton's own variables are (UCX refuses '').
  if (const char* t = std::getenv("UCX_RNDV_THRESH"); t != nullptr && *t == '\0')
    unsetenv("UCX_RNDV_THRESH");
  // The UCX_ variables set, for messages (UCX's own warning names only one).
  auto ucx_variables = [] {
    std::string set;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "UCX_", 4) == 0) set += std::string(set.empty() ? "" : ", ") + *e;
    return set;
  };
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    // A value UCX refuses is bad input (exit 2, not restarted by --max-restarts).
    const std::string set = ucx_variables();
    throw InputError(
        "UCX refused its configuration from the environment (its warning above "
        "names the variable); the UCX_ variables set: " +
        (set.empty() ? std::string("none") : set));
  }
  // Eager (copied through the shared FIFO) up to 64 KiB, rendezvous (one copy, by the
  // receiver) above: UCX's own threshold here is lower, and the handshake then costs
  // more than the second copy it saves (measured: a 32 KiB all-reduce 19 us -> 9 us).
  // UCX_RNDV_THRESH in the environment still wins.
  if (const char* env = std::getenv("UCX_RNDV_THRESH"); env == nullptr) {
    BATON_UCX_CHECK(ucp_config_modify(config, "RNDV_THRESH", "65536"));
  } else {
    // A plain byte count is the threshold; "auto" or a unit leaves it unknown here: 0
    // (a dead peer's queued messages then all count as rendezvous, see recv()).
    rndv_thresh_ = p2p_rendezvous_bytes();
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.estimated_num_eps = size_t(size);
  ucs_status_t st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  // No usable transport with UCX_ variables set (UCX_TLS=bogus reads without complaint and
  // fails here): their values, bad input, not restarted into again. Without any, the host's
  // own fault (a runtime error).
  if (st == UCS_ERR_NO_DEVICE || st == UCS_ERR_NO_ELEM || st == UCS_ERR_INVALID_PARAM) {
    if (const std::string set = ucx_variables(); !set.empty())
      throw InputError(std::string("UCX found no usable transport (") + ucs_status_string(st) +
                       ") under the UCX_ variables set: " + set +
                       " (its message above names what it was asked for)");
  }
  BATON_UCX_CHECK(st);
  try {
    start(store, prefix, host_label);
  } catch (...) {
    // A constructor that throws runs no destructor: release what was made.
    if (worker_) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    throw;
  }
}

void UcxFabric::start(Store& store, const std::string& prefix, const std::string& host_label) {
  const int rank = this->rank();
  const int size = this->size();
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  // One lock of ours (mu_) serialises every call, from the progress thread and callers.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  wp.events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  BATON_UCX_CHECK(ucp_worker_create(context_, &wp, &worker_));
  BATON_UCX_CHECK(ucp_worker_get_efd(worker_, &event_fd_));

  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0)
    throw RuntimeError("ucx: cannot create the progress thread's fds");
  // The control socket, in the family of the address the store sees us at.
  boost::system::error_code ec;
  std::string seen_text = store.local_address();
  asio::ip::address seen = asio::ip::make_address(seen_text, ec);
  if (ec) seen = asio::ip::address_v4::loopback();
  try {
    ctl_ = std::make_unique<ControlSocket>(seen, size_t(size));
  } catch (const boost::system::system_error& e) {
    throw RuntimeError("ucx: rank " + std::to_string(rank) +
                       ": cannot open the liveness protocol's UDP socket: " + e.what());
  }
  for (int fd : {event_fd_, wake_fd_, int(ctl_->socket.native_handle())}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      throw RuntimeError("ucx: epoll_ctl failed: " + std::string(std::strerror(errno)));
  }

  // Publish our host and addresses, read everyone's. The value is the host id, a NUL,
  // the host's label for messages, a NUL, the control socket's description, a NUL, then
  // the worker address.
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  BATON_UCX_CHECK(ucp_worker_get_address(worker_, &addr, &addr_len));
  const std::string me = host_id();
  std::string label = host_label;
  if (label.empty()) label = me.substr(0, me.find('/'));
  label.erase(std::remove(label.begin(), label.end(), '\0'), label.end());
  hosts_[size_t(rank)] = label;
  store.set(prefix + "/ucx/" + std::to_string(rank),
            me + '\0' + label + '\0' + ctl_->describe(seen) + '\0' +
                std::string(reinterpret_cast<char*>(addr), addr_len));
  ucp_worker_release_address(worker_, addr);
  const std::string mode = err_mode_setting();
  // Every peer at once: when some never come, the error names them all.
  std::vector<std::string> keys;
  for (int p = 0; p < size; ++p)
    if (p != rank) keys.push_back(prefix + "/ucx/" + std::to_string(p));
  try {
    store.wait(keys, options().connect_timeout);
  } catch (const RuntimeError& e) {
    throw RuntimeError(missing_peers(store, prefix, rank, size, options().connect_timeout, e));
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    std::string v = store.get(prefix + "/ucx/" + std::to_string(p), options().connect_timeout);
    size_t nul = v.find('\0');
    size_t nul2 = nul == std::string::npos ? nul : v.find('\0', nul + 1);
    size_t nul3 = nul2 == std::string::npos ? nul2 : v.find('\0', nul2 + 1);
    bool same_host = v.compare(0, nul, me) == 0;
    if (nul3 == std::string::npos ||
        !ctl_->learn(p, v.substr(nul2 + 1, nul3 - nul2 - 1), same_host))
      throw RuntimeError("ucx: malformed address of rank " + std::to_string(p));
    hosts_[size_t(p)] = v.substr(nul + 1, nul2 - nul - 1);
    addresses_[size_t(p)] = v.substr(nul3 + 1);
    // UCX 1.13's shared-memory transports cannot take part in peer-failure mode, so
    // endpoints to the same host go without it (our liveness protocol covers them);
    // endpoints to other hosts (TCP) get UCX's own failure reports too.
    peer_mode_[size_t(p)] = mode == "peer" || (mode == "auto" && !same_host);
  }

  // The standing receive of goodbyes, from any source.
  {
    std::lock_guard lock(mu_);
    controls_.push_back(std::make_unique<Control>());
    controls_.back()->fabric = this;
    controls_.back()->kind = kBye;
    post_control_locked(*controls_.back());
  }
  int64_t t = now_ns();
  for (auto& p : peers_) p.last_heard = t;
  thread_ = std::thread([this] { thread_main(); });
}

std::string UcxFabric::host_of(int peer) const {
  return peer >= 0 && peer < size() ? hosts_[size_t(peer)] : std::string();
}

UcxFabric::~UcxFabric() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    spdlog::warn("ucx: rank {}: error while closing: {}", rank(), e.what());
  }
  if (worker_) {
    // Sends to a peer that died can never complete, and UCX cannot take them back;
    // it would warn about each at destruction. We know why, and said so already.
    bool leftovers = false;
    for (UcxRequest* r = pending_; r; r = r->next)
      if (failure_of(r->peer)) leftovers = true;
    ucs_log_level_t level = ucs_global_opts.log_component.log_level;
    if (leftovers && level > UCS_LOG_LEVEL_ERROR)
      ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_ERROR;
    ucp_worker_destroy(worker_);
    ucs_global_opts.log_component.log_level = level;
    // Requests UCX never finished hold themselves alive: let them go.
    while (pending_ != nullptr) {
      UcxRequest* r = pending_;
      pending_ = r->next;
      r->tracked = false;
      r->self.reset();
    }
  }
  if (context_) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxFabric::shutdown() {
  stop_.store(true);
  poke();
  if (thread_.joinable()) thread_.join();
  std::unique_lock lock(mu_);
  // Say goodbye to every peer, so that they tell a finished rank from a failed one, then
  // flush and close every endpoint, within a bounded time.
  // A rank that leaves because another failed says which, so that its goodbye never
  // reads as the first failure to those who hear it before the failure itself.
  std::string bye(8, '\0');
  int32_t failed = -1;
  uint32_t len = 0;
  if (auto f = first_failure()) {
    failed = f->first;
    len = uint32_t(std::min<size_t>(f->second.size(), kControlBytes - 12));
    bye.append(f->second.substr(0, len));
  }
  std::memcpy(bye.data(), &failed, 4);
  std::memcpy(bye.data() + 4, &len, 4);
  for (int p = 0; p < size(); ++p)
    if (p != rank() && !ep_dead_[size_t(p)]) send_control_locked(p, kBye, bye);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  ucp_request_param_t fp{};
  void* flush = ucp_worker_flush_nbx(worker_, &fp);
  if (UCS_PTR_IS_PTR(flush)) {
    while (ucp_request_check_status(flush) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    ucp_request_free(flush);
  }
  std::vector<void*> closes;
  for (int p = 0; p < size(); ++p) {
    ucp_ep_h ep = eps_[size_t(p)];
    if (!ep) continue;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(r)) closes.push_back(r);
    eps_[size_t(p)] = nullptr;
  }
  for (void* r : closing_) closes.push_back(r);
  closing_.clear();
  for (void* r : closes) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    ucp_request_free(r);
  }
  // Receives nobody completed: cancel them (their callbacks free them).
  for (auto& c : controls_)
    if (c->request) ucp_request_cancel(worker_, c->request);
  std::vector<void*> open;
  for (UcxRequest* r = pending_; r; r = r->next)
    if (!r->is_send && r->backend) open.push_back(r->backend);
  for (void* q : open) ucp_request_cancel(worker_, q);
  ucp_worker_progress(worker_);
  // Messages nobody will receive (a peer's goodbye that came after ours): take them off
  // the unexpected queue so that UCX has nothing left to warn about. Eager ones only,
  // looked at before they are taken: receiving a rendezvous one needs its sender's
  // endpoint, closed above (UCX 1.13 asserted inside that receive, seen with a killed
  // rank's last 16 MiB all-reduce); it and what queued after it go with the worker.
  std::vector<char> sink;
  for (int i = 0; i < 10000; ++i) {
    ucp_tag_recv_info_t info{};
    if (ucp_tag_probe_nb(worker_, 0, 0, 0, &info) == nullptr || info.length >= rndv_thresh_) break;
    ucp_tag_message_h m = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
    if (m == nullptr) break;
    sink.resize(std::max<size_t>(info.length, 1));
    ucp_request_param_t rp{};
    void* q = ucp_tag_msg_recv_nbx(worker_, sink.data(), info.length, m, &rp);
    if (UCS_PTR_IS_PTR(q)) {
      while (ucp_request_check_status(q) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline)
        ucp_worker_progress(worker_);
      ucp_request_free(q);
    }
  }
  auto closed = std::make_exception_ptr(RuntimeError("the communicator was closed"));
  for (UcxRequest* r = pending_; r; r = r->next)
    if (!r->done()) fail(*r, closed);
}

// ---- endpoints ----

ucp_ep_h UcxFabric::ep_locked(int peer) {
  ucp_ep_h ep = eps_[size_t(peer)];
  if (ep) return ep;
  auto arg = std::make_unique<EpArg>(EpArg{this, peer});
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(addresses_[size_t(peer)].data());
  // Peer failure mode: UCX reports a lost connection through ep_error_cb instead of
  // failing the whole worker.
  ep_params.err_mode =
      peer_mode_[size_t(peer)] ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep_params.err_handler.cb = &UcxFabric::ep_error_cb;
  ep_params.err_handler.arg = arg.get();
  ucs_status_t st = ucp_ep_create(worker_, &ep_params, &ep);
  if (st != UCS_OK) {
    // A peer we cannot reach (its process is gone): a failure, not an exception here,
    // which may be the progress thread.
    ep_dead_[size_t(peer)] = true;
    failures_.push_back(
        {peer, std::string("cannot connect (") + ucs_status_string(st) + ")", true});
    return nullptr;
  }
  eps_[size_t(peer)] = ep;
  ep_args_[size_t(peer)] = std::move(arg);
  return ep;
}

void UcxFabric::ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* a = static_cast<EpArg*>(arg);
  UcxFabric* f = a->fabric;
  // Runs inside progress, with mu_ held: record, apply after unlocking.
  if (f->ep_dead_[size_t(a->peer)]) return;
  f->ep_dead_[size_t(a->peer)] = true;
  f->eps_[size_t(a->peer)] = nullptr;
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(ep, &cp);
  if (UCS_PTR_IS_PTR(r)) f->closing_.push_back(r);
  bool left = f->peers_[size_t(a->peer)].left;
  f->failures_.push_back({a->peer,
                          left ? std::string("it left the job (closed its communicator)")
                               : std::string("connection lost (") + ucs_status_string(status) + ")",
                          !left, left});
}

// ---- requests ----

std::shared_ptr<UcxFabric::UcxRequest> UcxFabric::make_request(int peer, bool is_send,
                                                               size_t bytes) {
  auto r = std::make_shared<UcxRequest>();
  r->peer = peer;
  r->is_send = is_send;
  r->bytes = bytes;
  r->owner = this;
  return r;
}

void UcxFabric::track_locked(const std::shared_ptr<UcxRequest>& r, void* ucx_request) {
  r->backend = ucx_request;
  r->self = r;
  r->tracked = true;
  r->counted = true;
  r->prev = nullptr;
  r->next = pending_;
  if (pending_) pending_->prev = r.get();
  pending_ = r.get();
  if (pending_per_peer_[size_t(r->peer)]++ == 0) peers_[size_t(r->peer)].watch_since = now_ns();
  if (r->is_send) ++sends_in_flight_;
}

void UcxFabric::untrack_locked(UcxRequest* r) {
  if (!r->tracked) return;
  r->tracked = false;
  if (r->counted) {
    r->counted = false;
    if (--pending_per_peer_[size_t(r->peer)] == 0) peers_[size_t(r->peer)].watch_since = 0;
  }
  if (r->is_send) --sends_in_flight_;
  if (r->prev)
    r->prev->next = r->next;
  else
    pending_ = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = nullptr;
  r->backend = nullptr;
  r->self.reset();  // may free r: nothing touches it after this
}

void UcxFabric::send_cb(void* request, ucs_status_t status, void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  UcxFabric* f = static_cast<UcxFabric*>(r->owner);
  if (!r->done()) {
    if (status == UCS_OK)
      complete(*r);
    else
      fail(*r, std::make_exception_ptr(
                   f->failure_of(r->peer)
                       ? f->peer_error(r->peer)
                       : PeerError(r->peer, "send to rank " + std::to_string(r->peer) +
                                                " failed: " + ucs_status_string(status))));
  }
  f->untrack_locked(r);
  ucp_request_free(request);
}

void UcxFabric::complete_recv_locked(UcxRequest* r, ucs_status_t status,
                                     const ucp_tag_recv_info_t* info) {
  if (status == UCS_OK) peers_[size_t(r->peer)].last_heard = now_ns();
  if (r->done()) return;
  if (status == UCS_OK && info->length == r->bytes) {
    complete(*r);
  } else if (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED) {
    fail(*r, std::make_exception_ptr(RuntimeError(
                 "message size mismatch from rank " + std::to_string(r->peer) + " to rank " +
                 std::to_string(rank()) + ": receive expects " + std::to_string(r->bytes) +
                 " bytes, the message has " +
                 (status == UCS_OK ? std::to_string(info->length) : std::string("more")))));
  } else if (failure_of(r->peer)) {
    fail(*r, std::make_exception_ptr(peer_error(r->peer)));
  } else {
    // The transport gave up on the connection: the peer is gone.
    std::string why = std::string("connection lost (") + ucs_status_string(status) + ")";
    fail(*r, std::make_exception_ptr(PeerError(r->peer, "rank " + std::to_string(r->peer) +
                                                            " failed: " + why + " (seen by rank " +
                                                            std::to_string(rank()) + ")")));
    if (status != UCS_ERR_CANCELED) failures_.push_back({r->peer, why, true});
  }
}

void UcxFabric::recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                        void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  UcxFabric* f = static_cast<UcxFabric*>(r->owner);
  f->complete_recv_locked(r, status, info);
  f->untrack_locked(r);
  ucp_request_free(request);
}

RequestPtr UcxFabric::isend(const void* data, size_t bytes, int dst, uint64_t tag) {
  // UCX cannot connect a worker to itself ("no active messages transport").
  if (dst == rank()) return self_isend(data, bytes, tag);
  auto r = make_request(dst, true, bytes);
  if (failure_of(dst)) {
    fail_gone(*r, dst);
    return r;
  }
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.cb.send = &UcxFabric::send_cb;
  p.user_data = r.get();
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  bool need_poke = false;
  {
    std::lock_guard lock(mu_);
    if (ep_dead_[size_t(dst)]) {
      if (failure_of(dst))
        fail_gone(*r, dst);
      else
        fail(*r, std::make_exception_ptr(
                     PeerError(dst, "connection to rank " + std::to_string(dst) + " was lost")));
      return r;
    }
    ucp_ep_h ep = ep_locked(dst);
    if (ep == nullptr) {
      fail(*r, std::make_exception_ptr(
                   PeerError(dst, "rank " + std::to_string(dst) + " failed: cannot connect")));
      need_poke = true;  // the progress thread applies the failure and tells the others
    } else {
      void* q =
          BATON_UCX_CHECK_PTR(ucp_tag_send_nbx(ep, data ? data : &g_zero_byte, bytes, tag, &p));
      if (q == nullptr) {
        complete(*r);
        return r;
      }
      track_locked(r, q);
      need_poke = thread_sleeping_.load();
    }
  }
  // A send that did not finish at once needs progress even if its caller never waits.
  if (need_poke) poke();
  return r;
}

RequestPtr UcxFabric::irecv(void* data, size_t bytes, int src, uint64_t tag) {
  if (src == rank()) return self_irecv(data, bytes, tag);
  auto r = make_request(src, false, bytes);
  ucp_request_param_t p{};
  // No immediate completion: UCX 1.13 does not fill in the message length when a
  // receive completes inside the call, and we must check it. The callback then runs
  // inside the call instead, on a request we already track.
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxFabric::recv_cb;
  p.user_data = r.get();
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  std::lock_guard lock(mu_);
  if (failure_of(src)) {
    // A message the peer sent before it went may still be here, whole if it came eagerly;
    // a rendezvous one would need the peer's endpoint, closed when it failed (UCX 1.13
    // then asserts inside the receive: seen once in CI with a killed rank). Anything
    // else never comes.
    ucp_tag_recv_info_t probe{};
    if (ucp_tag_probe_nb(worker_, tag, kFullMask, 0, &probe) == nullptr ||
        probe.length >= rndv_thresh_) {
      fail_gone(*r, src);
      return r;
    }
  }
  track_locked(r, nullptr);
  void* q = ucp_tag_recv_nbx(worker_, data ? data : &g_zero_byte, bytes, tag, kFullMask, &p);
  if (UCS_PTR_IS_ERR(q)) {
    untrack_locked(r.get());
    BATON_UCX_CHECK_PTR(q);
  }
  // If the callback already ran, q is released; otherwise remember it for cancelling.
  if (r->tracked) r->backend = q;
  return r;
}

size_t UcxFabric::fail_pending(int peer, const PeerError& error) {
  auto e = std::make_exception_ptr(error);
  std::lock_guard lock(mu_);
  size_t hit = 0;
  std::vector<void*> cancel;
  for (UcxRequest* r = pending_; r; r = r->next) {
    if (r->peer != peer) continue;
    if (!r->done()) {
      fail(*r, e);
      ++hit;
    }
    if (r->counted) {
      r->counted = false;
      if (--pending_per_peer_[size_t(peer)] == 0) peers_[size_t(peer)].watch_since = 0;
    }
    if (!r->is_send && r->backend) cancel.push_back(r->backend);
  }
  // Unmatched receives from the peer will never match: cancel them (the callback,
  // called from here, releases them). Sends end when the endpoint closes.
  for (void* q : cancel) ucp_request_cancel(worker_, q);
  ucp_ep_h ep = eps_[size_t(peer)];
  if (ep && !ep_dead_[size_t(peer)]) {
    ep_dead_[size_t(peer)] = true;
    eps_[size_t(peer)] = nullptr;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* q = ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(q)) closing_.push_back(q);
  }
  ep_dead_[size_t(peer)] = true;
  return hit;
}

// ---- the liveness protocol ----

void UcxFabric::post_control_locked(Control& c) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxFabric::control_cb;
  p.user_data = &c;
  c.fired = false;
  // Any source: the mask leaves out the source bits.
  uint64_t tag = make_tag(kControlContext, 0, true, c.kind);
  void* q =
      BATON_UCX_CHECK_PTR(ucp_tag_recv_nbx(worker_, c.buf, kControlBytes, tag, ~kSourceMask, &p));
  c.request = c.fired ? nullptr : q;  // a message already here ran the callback inside the call
}

void UcxFabric::control_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                           void* user) {
  auto* c = static_cast<Control*>(user);
  UcxFabric* f = c->fabric;
  c->request = nullptr;
  c->fired = true;
  ucp_request_free(request);
  if (status != UCS_OK) return;  // cancelled at shutdown
  // The sender names itself in the payload: UCX 1.13 does not always fill in the
  // sender's tag for a receive with a wildcard source.
  int32_t src = -1;
  if (info->length >= 4) std::memcpy(&src, c->buf, 4);
  if (info->length >= 4) f->on_control_locked(src, c->kind, c->buf + 4, info->length - 4);
  f->to_repost_.push_back(c);
}

void UcxFabric::on_control_locked(int src, uint64_t kind, const char* payload, size_t len) {
  if (src < 0 || src >= size() || src == rank()) return;
  peers_[size_t(src)].last_heard = now_ns();
  switch (kind) {
    case kPing:
      to_pong_.push_back(src);
      break;
    case kNotice:
    case kBye: {
      int32_t failed = -1;
      uint32_t reason = 0;
      if (len >= 8) {
        std::memcpy(&failed, payload, 4);
        std::memcpy(&reason, payload + 4, 4);
        reason = std::min<uint32_t>(reason, uint32_t(len - 8));
      }
      if (failed >= 0 && failed < size() && failed != rank())
        failures_.push_back(
            {failed,
             std::string(payload + 8, reason) + " (reported by rank " + std::to_string(src) + ")",
             false});
      if (kind == kBye) {
        peers_[size_t(src)].left = true;
        failures_.push_back({src, "it left the job (closed its communicator)", false, true});
      }
      break;
    }
    default:  // a pong: hearing it was the point
      break;
  }
}

void UcxFabric::drain_control_socket_locked() {
  ControlSocket& c = *ctl_;
  for (int i = 0; i < 256; ++i) {
    udp::endpoint from;
    boost::system::error_code ec;
    size_t n = c.socket.receive_from(asio::buffer(c.buf), from, 0, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return;
    // Any other error concerns one datagram: go on.
    if (ec || n < sizeof(DatagramHeader)) continue;
    DatagramHeader h;
    std::memcpy(&h, c.buf.data(), sizeof h);
    if (h.nonce != c.nonce) continue;
    on_control_locked(h.sender, h.kind, c.buf.data() + sizeof h, n - sizeof h);
  }
}

void UcxFabric::control_send_cb(void* request, ucs_status_t, void* user) {
  delete static_cast<std::string*>(user);
  ucp_request_free(request);
}

void UcxFabric::send_control_locked(int peer, uint64_t kind, const std::string& payload) {
  if (ep_dead_[size_t(peer)]) return;
  if (kind != kBye || eps_[size_t(peer)] == nullptr) {
    // Best effort, like the ping that repeats: a datagram lost is the same as silence.
    DatagramHeader h{ctl_->peer_nonces[size_t(peer)], uint32_t(kind), int32_t(rank())};
    std::string d(reinterpret_cast<const char*>(&h), sizeof h);
    d.append(payload);
    boost::system::error_code ignored;
    ctl_->socket.send_to(asio::buffer(d), ctl_->peers[size_t(peer)], 0, ignored);
    return;
  }
  // Every control message starts with the sender's rank.
  int32_t me = rank();
  auto* buf = new std::string(reinterpret_cast<const char*>(&me), 4);
  buf->append(payload);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxFabric::control_send_cb;
  p.user_data = buf;
  ucp_ep_h ep = ep_locked(peer);
  if (ep == nullptr) {
    delete buf;
    return;
  }
  void* q = ucp_tag_send_nbx(ep, buf->data(), buf->size(),
                             make_tag(kControlContext, rank(), true, kind), &p);
  if (!UCS_PTR_IS_PTR(q)) delete buf;  // done at once, or failed (the ep error reports it)
}

void UcxFabric::after_progress_locked() {
  while (!to_repost_.empty()) {
    auto pending = std::move(to_repost_);
    to_repost_.clear();
    if (stop_.load()) break;
    for (Control* c : pending) post_control_locked(*c);
  }
  auto pongs = std::move(to_pong_);
  to_pong_.clear();
  for (int p : pongs) send_control_locked(p, kPong, {});
}

bool UcxFabric::progress_locked() {
  unsigned n = ucp_worker_progress(worker_);
  if (!to_repost_.empty() || !to_pong_.empty()) after_progress_locked();
  return n > 0;
}

bool UcxFabric::progress() {
  bool any = false;
  bool failures = false;
  if (mu_.try_lock()) {
    any = progress_locked();
    failures = !failures_.empty();
    mu_.unlock();
  }
  if (failures) apply_failures();
  return any;
}

void UcxFabric::apply_failures() {
  std::vector<Failure> todo;
  {
    std::lock_guard lock(mu_);
    todo.swap(failures_);
  }
  for (auto& f : todo) {
    if (knows_failure(f.peer, f.left)) continue;
    if (f.tell_others)
      spdlog::error("rank {}: rank {} failed: {}", rank(), f.peer, f.reason);
    else
      spdlog::debug("rank {}: rank {}: {}", rank(), f.peer, f.reason);
    declare_failed(f.peer, f.reason, f.left);
    if (f.tell_others) {
      // Ranks that wait on someone who waits on the failed rank would otherwise only
      // learn of it second-hand, and late: tell everyone.
      std::string payload(8, '\0');
      int32_t who = f.peer;
      uint32_t len = uint32_t(std::min<size_t>(f.reason.size(), kControlBytes - 12));
      std::memcpy(payload.data(), &who, 4);
      std::memcpy(payload.data() + 4, &len, 4);
      payload.append(f.reason.substr(0, len));
      std::lock_guard lock(mu_);
      for (int p = 0; p < size(); ++p)
        if (p != rank() && p != f.peer && !failure_of(p)) send_control_locked(p, kNotice, payload);
    }
  }
}

void UcxFabric::report_stalled(int peer, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    failures_.push_back({peer, reason, true});
  }
  apply_failures();  // logged, recorded and told to the other ranks
}

int64_t UcxFabric::tick_ns() const {
  return std::max<int64_t>(int64_t(options().peer_timeout.count()) * 1'000'000 / 8, 5'000'000);
}

void UcxFabric::liveness_tick(int64_t now) {
  const int64_t timeout = int64_t(options().peer_timeout.count()) * 1'000'000;
  const int64_t ping_every = timeout / 4;
  const int64_t tick = tick_ns();
  std::lock_guard lock(mu_);
  // Silence is evidence only while this rank listens. A tick over a whole tick late means
  // the progress thread itself did not run (the process stopped, or the host gave its
  // cores to others for seconds): peers stopped with it, or on the same cores, could
  // not answer a ping it could not send. A whole job held past the peer timeout had
  // each rank declare its peer at its first tick after, both at the same instant. The
  // gap beyond one tick counts as nobody's silence.
  const int64_t held = last_tick_ > 0 ? now - last_tick_ - tick : 0;
  last_tick_ = now;
  if (held > tick) {
    spdlog::debug("rank {}: progress thread held for {} ms: not counted as any peer's silence",
                  rank(), held / 1'000'000);
    for (PeerState& s : peers_) {
      s.last_heard = std::min(s.last_heard + held, now);
      if (s.watch_since != 0) s.watch_since = std::min(s.watch_since + held, now);
    }
  }
  for (int p = 0; p < size(); ++p) {
    PeerState& s = peers_[size_t(p)];
    if (pending_per_peer_[size_t(p)] == 0 || p == rank() || ep_dead_[size_t(p)]) continue;
    int64_t silent = now - std::max(s.last_heard, s.watch_since);
    if (silent > timeout) {
      failures_.push_back({p,
                           "no answer for " + std::to_string(silent / 1'000'000) +
                               " ms (peer timeout " +
                               std::to_string(options().peer_timeout.count()) + " ms)",
                           true});
    } else if (silent > ping_every / 2 && now - s.last_ping > ping_every / 2) {
      s.last_ping = now;
      send_control_locked(p, kPing, {});
    }
  }
}

// ---- the progress thread ----

void UcxFabric::poke() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof one);
  (void)ignored;
}

void UcxFabric::on_poll_begin() {
  pollers_.fetch_add(1, std::memory_order_relaxed);
}

void UcxFabric::on_poll_end() {
  last_poll_ns_.store(now_ns(), std::memory_order_relaxed);
  pollers_.fetch_sub(1, std::memory_order_relaxed);
}

void UcxFabric::on_sleep_begin() {
  // The caller stops driving progress: the thread takes over at once.
  last_poll_ns_.store(0, std::memory_order_relaxed);
  if (thread_sleeping_.load() || thread_napping_.load()) poke();
}

void UcxFabric::thread_main() {
  const int64_t tick = tick_ns();
  int idle_rounds = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool active = false;
    bool in_flight = false;
    {
      std::lock_guard lock(mu_);
      for (int i = 0; i < 16 && progress_locked(); ++i) active = true;
      // The control socket only here: callers poll the data worker alone, and a ping
      // can wait the millisecond of a nap.
      drain_control_socket_locked();
      if (!to_pong_.empty()) after_progress_locked();
      in_flight = sends_in_flight_ > 0;
    }
    apply_failures();
    int64_t now = now_ns();
    if (now >= next_tick_) {
      next_tick_ = now + tick;
      liveness_tick(now);
      apply_failures();
    }
    if (active) {
      idle_rounds = 0;
      continue;
    }
    // A caller is polling (or just was): it drives the worker. Waking on every event
    // too would put a third busy thread on the cores and slow the caller down, so
    // step aside, with a short nap in case it stops without saying so.
    if (pollers_.load(std::memory_order_relaxed) > 0 ||
        now_ns() - last_poll_ns_.load(std::memory_order_relaxed) < 1'000'000) {
      thread_napping_.store(true);
      pollfd pfd[2] = {{wake_fd_, POLLIN, 0}, {ctl_->socket.native_handle(), POLLIN, 0}};
      int woke = ::poll(pfd, 2, 1);
      thread_napping_.store(false);
      if (woke > 0 && pfd[0].revents) {
        uint64_t v;
        ssize_t ignored = read(wake_fd_, &v, sizeof v);
        (void)ignored;
      }
      idle_rounds = 0;
      continue;
    }
    // Sends still going out need the sender's progress (shared-memory FIFOs have no
    // "space again" event): keep polling, politely, while any is in flight.
    if (in_flight || ++idle_rounds < 64) {
      if (in_flight) idle_rounds = 0;
      for (int i = 0; i < 32; ++i) cpu_relax();
      std::this_thread::yield();
      continue;
    }
    ucs_status_t st;
    {
      // Marked asleep under the lock: a send posted after this sees the mark and pokes
      // us; one posted before it is seen here.
      std::lock_guard lock(mu_);
      if (sends_in_flight_ > 0) continue;
      thread_sleeping_.store(true);
      st = ucp_worker_arm(worker_);
      if (st != UCS_OK) thread_sleeping_.store(false);
    }
    if (st == UCS_ERR_BUSY) continue;
    if (st != UCS_OK) BATON_UCX_CHECK(st);
    epoll_event evs[3];
    int wait_ms = int(std::max<int64_t>(1, (next_tick_ - now_ns()) / 1'000'000));
    int n = epoll_wait(epoll_fd_, evs, 3, wait_ms);
    thread_sleeping_.store(false);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == wake_fd_) {
        uint64_t v;
        ssize_t ignored = read(wake_fd_, &v, sizeof v);
        (void)ignored;
      }
    }
    idle_rounds = 0;
  }
}

}  // namespace baton::transport::detail

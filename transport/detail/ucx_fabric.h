// The UCX fabric: one UCP worker per process, used through UCX's tag interface, with
// shared memory or TCP as UCX chooses. A progress thread drives the worker when no
// caller does (sleeping on the worker's event fd, not spinning), answers liveness
// pings, and declares peers failed when they die or fall silent.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/detail/fabric.h"
#include "transport/store.h"

namespace baton::transport::detail {

class UcxFabric final : public Fabric {
 public:
  // Publishes this worker's address under "<prefix>/ucx/<rank>" and reads every peer's.
  // host_label: this rank's host in its peers' messages (empty: the host name).
  UcxFabric(int rank, int size, Store& store, const std::string& prefix, CommOptions options,
            const std::string& host_label = {});
  ~UcxFabric() override;

  std::string backend() const override { return "ucx"; }
  // Where a rank runs, as it announced itself (its host label).
  std::string host_of(int peer) const;
  RequestPtr isend(const void* data, size_t bytes, int dst, uint64_t tag) override;
  RequestPtr irecv(void* data, size_t bytes, int src, uint64_t tag) override;

  struct Control;        // a posted receive of the goodbye (the one control message on UCX)
  struct ControlSocket;  // the UDP socket of pings, pongs and notices
  struct EpArg {
    UcxFabric* fabric;
    int peer;
  };

 protected:
  bool progress() override;
  size_t fail_pending(int peer, const PeerError& error) override;
  void on_poll_begin() override;
  void on_poll_end() override;
  void on_sleep_begin() override;
  void report_stalled(int peer, const std::string& reason) override;

 private:
  // A request UCX still holds: on an intrusive list (no allocation per message), kept
  // alive by its own reference until UCX's callback has run.
  struct UcxRequest : Request {
    RequestPtr self;
    UcxRequest* prev = nullptr;
    UcxRequest* next = nullptr;
    bool tracked = false;
    bool counted = false;  // counted in pending_per_peer_
  };
  struct Failure {
    int peer;
    std::string reason;
    bool tell_others;   // detected here (not reported by a peer): pass it on
    bool left = false;  // said goodbye: fails only what involves it directly
  };
  struct PeerState {
    int64_t last_heard = 0;   // ns, steady clock: the last message from it
    int64_t watch_since = 0;  // ns: when we began waiting on it (0: not waiting)
    int64_t last_ping = 0;
    bool left = false;  // said goodbye
  };

  // The worker, the address exchange and the progress thread (the constructor's body).
  void start(Store& store, const std::string& prefix, const std::string& host_label);
  // Everything below with _locked runs with mu_ held.
  ucp_ep_h ep_locked(int peer);
  bool progress_locked();
  void after_progress_locked();
  void post_control_locked(Control& c);
  void send_control_locked(int peer, uint64_t kind, const std::string& payload);
  // A control message from `src` (its payload after the sender's rank), either way.
  void on_control_locked(int src, uint64_t kind, const char* payload, size_t len);
  void drain_control_socket_locked();  // every datagram waiting on the control socket
  std::shared_ptr<UcxRequest> make_request(int peer, bool is_send, size_t bytes);
  void track_locked(const std::shared_ptr<UcxRequest>& r, void* ucx_request);
  void untrack_locked(UcxRequest* r);
  void apply_failures();  // without mu_
  void liveness_tick(int64_t now);
  int64_t tick_ns() const;  // how often the progress thread runs liveness_tick
  void thread_main();
  void poke();
  void shutdown();

  static void send_cb(void* request, ucs_status_t status, void* user);
  static void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user);
  static void control_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user);
  static void control_send_cb(void* request, ucs_status_t status, void* user);
  static void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t status);
  void complete_recv_locked(UcxRequest* r, ucs_status_t status, const ucp_tag_recv_info_t* info);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // the worker's
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: pokes the progress thread

  std::mutex mu_;
  std::vector<std::string> addresses_;
  std::vector<std::string> hosts_;  // each rank's host label (written before the thread starts)
  std::vector<ucp_ep_h> eps_;
  std::vector<std::unique_ptr<EpArg>> ep_args_;
  std::vector<bool> ep_dead_;
  // Messages below it travel eagerly (whole in the receiver's queue once sent); from it
  // up by rendezvous, which needs the sender's endpoint to fetch the data.
  size_t rndv_thresh_ = 65536;
  std::vector<bool> peer_mode_;    // UCX peer-failure mode for this peer's endpoint
  UcxRequest* pending_ = nullptr;  // head of the list of requests UCX holds
  std::vector<int> pending_per_peer_;
  int sends_in_flight_ = 0;
  std::vector<PeerState> peers_;
  std::vector<Failure> failures_;
  std::vector<int> to_pong_;
  std::vector<std::unique_ptr<Control>> controls_;
  std::vector<Control*> to_repost_;
  std::vector<void*> closing_;  // ep close requests to release at the end
  // Pings, pongs and notices go by UDP, not through UCX: a peer killed while it writes
  // into our shared-memory FIFO leaves a slot that is never completed, and every later
  // message in that FIFO, from anyone, waits behind it for good. Pings through it would
  // make this live rank look dead to every other. Datagrams have no such shared state
  // and no connection to break.
  std::unique_ptr<ControlSocket> ctl_;
  int64_t next_tick_ = 0;
  int64_t last_tick_ = 0;  // ns: when liveness_tick last ran (0: never)

  std::atomic<bool> stop_{false};
  std::atomic<bool> thread_sleeping_{false};  // armed: nothing drives progress but a poke
  // Napping (at most 1 ms) beside a caller that polls, or just did: a send does not poke
  // it (that woke it on the caller's core for every rendezvous send: 64 KiB sendrecv at
  // 20 us where UCX's own tag_lat takes 7), the caller's next poll or the nap's end does.
  std::atomic<bool> thread_napping_{false};
  std::atomic<int> pollers_{0};           // callers polling in wait() right now
  std::atomic<int64_t> last_poll_ns_{0};  // when a caller last polled
  std::thread thread_;
};

}  // namespace baton::transport::detail

// CommOptions: the settings every backend shares (failure timeout, how long a waiting
// thread spins before it sleeps), and how they are read from the environment.
#pragma once

#include <chrono>

namespace baton::transport {

struct CommOptions {
  // A peer that is gone or silent this long while an operation waits on it turns that
  // operation into a PeerError (detected within peer_timeout * 1.125, so the default
  // stays under 30 s). Liveness is checked by the progress thread, not by the
  // operation's own duration: a peer that is busy computing still answers.
  std::chrono::milliseconds peer_timeout{20'000};
  // How long a waiting thread polls for completion before it sleeps. Polling keeps
  // small-message latency low; sleeping keeps idle ranks off the cores.
  std::chrono::microseconds spin{200};
  // How long start-up may wait for the other ranks to reach the rendezvous.
  std::chrono::milliseconds connect_timeout{120'000};
  // How long one operation may wait on a peer that answers the liveness pings (its
  // process runs) but does not take part (its training thread stuck: a deadlock, a hung
  // file system) before that peer counts as failed; 0: forever. Like NCCL's watchdog
  // timeout, far above any step's legitimate wait.
  std::chrono::milliseconds stall_timeout{1'800'000};

  // Reads BATON_PEER_TIMEOUT, BATON_CONNECT_TIMEOUT and BATON_STALL_TIMEOUT (seconds,
  // e.g. "2" or "0.5") and BATON_SPIN_US over the defaults; throws InputError naming the
  // variable for a bad value.
  static CommOptions from_env();
};

// The peer timeout of `baton train --plan` ranks when BATON_PEER_TIMEOUT is unset: a
// training job notices a dead peer well within 10 s (the default above suits long
// collectives of very large jobs). The launcher uses it too for such ranks' stopped limit.
inline constexpr std::chrono::milliseconds kTrainingPeerTimeout{4'000};

// Whether an environment variable is set to something: empty is unset, as every reader
// of baton's variables takes it.
bool env_is_set(const char* name);

}  // namespace baton::transport

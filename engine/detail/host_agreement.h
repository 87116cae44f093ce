// What the ranks of a plan run, which may be on hosts that do not share files, check
// that they read and write alike: the checkpoint a --resume continues from, the
// checkpoint directory at start-up, and the contents of the files under --data,
// --eval-data and --init-from (the flags' paths are compared elsewhere; one path can hold
// other files on another host). Each is a collective every rank calls; on a difference
// every rank throws the same InputError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/communicator.h"

namespace baton::engine::detail {

// The step of the newest complete checkpoint under `root` as rank 0 sees it (-1: none),
// after every rank has checked that its own copy of that checkpoint's manifest is rank
// 0's, byte for byte (a host whose directory held another run's checkpoint at the same
// step had resumed from it silently).
int64_t agree_on_checkpoint(transport::Communicator& world, const std::string& root);

// --checkpoint-dir: rank 0 writes a file with a nonce of this job into `dir` and every
// rank reads it back; a rank that does not see it (a directory of the same name on
// another host) is refused before the first step, where the first save had failed.
void check_checkpoint_dir_shared(transport::Communicator& world, const std::string& dir);

// A cheap identity of a file's or directory's contents: each file's size and a hash of
// its first and last 4 KiB ("missing" for a path that does not exist).
std::string contents_identity(const std::string& path);

// `paths` (one flag's, the same on every rank) must hold the same contents on every rank.
void check_same_contents(transport::Communicator& world, const std::string& flag,
                         const std::vector<std::string>& paths);

}  // namespace baton::engine::detail

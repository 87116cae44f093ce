// Model inputs staged to a device ahead of use (memory/input_staging.h): each
// micro-batch's host tensors are written into a pinned slot and copied to the device on
// the copy stream while earlier micro-batches compute. A micro-batch is taken as device
// tensors of its own (one device-to-device copy on the compute stream, ordered after
// the staging copy), so its slot is free again at once: the stage keeps its inputs until
// the micro-batch's backward (the ids for the embedding's gradient, the targets for the
// loss's), which may be many micro-batches later, longer than a ring of slots could
// hold them. Used by the executor's loader thread and by the one-process trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/input_staging.h"
#include "stages/stage.h"

namespace baton::engine::detail {

class StagedInputs {
 public:
  using Backend = std::function<std::unique_ptr<memory::StagingBackend>()>;
  // depth: micro-batches staged and not yet taken, at most (the ring's slots).
  StagedInputs(Backend make_backend, int depth);
  ~StagedInputs();
  StagedInputs(const StagedInputs&) = delete;
  StagedInputs& operator=(const StagedInputs&) = delete;

  // Stages one micro-batch's inputs: its ticket, in staging order from 0. -1: not staged
  // (its names or shapes differ from the first micro-batch's, which fixed the slots; the
  // caller passes the host tensors on, and the stage copies them itself).
  int64_t stage(const stages::TensorMap& host);
  // The device tensors of a ticket, taken once, in staging order; the calling thread's
  // compute stream is ordered after their copy.
  stages::TensorMap take(int64_t ticket);

  int64_t staged() const;  // micro-batches staged so far

 private:
  Backend make_backend_;
  int depth_;
  mutable std::mutex mu_;  // stage() and take() come from different threads
  std::unique_ptr<memory::InputStager> stager_;
  std::vector<std::string> names_;
  std::vector<memory::InputStager::Field> fields_;
};

}  // namespace baton::engine::detail

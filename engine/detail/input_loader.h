// The executor's input loader: a background thread that makes the model inputs (token
// ids, targets) of the micro-batches a rank will need, in the order it will need them,
// a few micro-batches ahead, so that a forward never waits for data it could have had.
// With a staging backend (a stage on a GPU) it also stages them to the device
// (StagedInputs): the copies run on their own stream, ahead, like the loading.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/detail/staged_inputs.h"
#include "engine/executor.h"

namespace baton::engine::detail {

class InputLoader {
 public:
  // `clock`: seconds on the executor's timeline clock (the recorded loads' times);
  // `staging`: empty, or the backend the inputs are staged to the device through.
  InputLoader(InputFn fn, std::vector<std::string> names, int ahead, std::function<double()> clock,
              StagedInputs::Backend staging = {});
  ~InputLoader();  // stops the thread (work in progress finishes first)
  InputLoader(const InputLoader&) = delete;
  InputLoader& operator=(const InputLoader&) = delete;

  // Queues a micro-batch; `uses`: how many take() calls will ask for it.
  void enqueue(const stages::MicroBatch& mb, int uses);
  // The inputs of (step, micro-batch index), waiting until they are made. Rethrows what
  // the input function threw (on any later call too). `waited`: set when they were not
  // made yet at the call.
  stages::TensorMap take(int64_t step, int64_t index, bool* waited = nullptr);

  // Recording: while on, each micro-batch the loader makes is kept as a Made, until
  // drained.
  struct Made {
    int64_t step = 0, index = 0;
    double start = 0, end = 0;
  };
  void set_recording(bool on);
  std::vector<Made> drain_made();

 private:
  struct Item {
    stages::MicroBatch mb;
    int uses = 0;
    bool taken = false;  // used at least once (later uses may come much later: a V's
                         // last stage reads the targets of a micro-batch whose tokens
                         // the first stage read long before)
    bool ready = false;
    stages::TensorMap tensors;  // on the host; on the device once taken, where staged
    int64_t ticket = -1;        // StagedInputs' ticket while staged and not yet taken
  };
  void loop();

  InputFn fn_;
  std::vector<std::string> names_;
  int ahead_;
  std::function<double()> clock_;
  std::unique_ptr<StagedInputs> staged_;  // null: the stage copies its inputs itself
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;  // in order of first use; ready ones first
  size_t made_ = 0;         // items_[0, made_) are ready
  size_t unused_ = 0;       // ready items not taken yet: the loader keeps ahead_ of them
  bool stop_ = false;
  std::exception_ptr error_;
  bool recording_ = false;
  std::vector<Made> made_log_;
  std::thread thread_;
};

}  // namespace baton::engine::detail

// The unit of the schedule IR: one action of one rank (a compute pass, one side of a
// point-to-point transfer, a data-parallel gradient reduction, the optimizer step) and
// its compact text token ("1F3", "0SEND_F2", "2REDUCE", "STEP").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace baton::schedule {

enum class ActionKind : uint8_t {
  forward,           // F: forward of (micro-batch, stage)
  backward_input,    // B: gradient of the stage's input (needs the gradient of its output)
  backward_weight,   // W: gradient of the stage's weights (needs the B of the same pair)
  full_backward,     // BW: B and W as one pass
  send_activation,   // SEND_F: the stage's output activation, to the next stage's rank
  recv_activation,   // RECV_F: the stage's input activation, from the previous stage's rank
  send_gradient,     // SEND_B: the gradient of the stage's input, to the previous stage's rank
  recv_gradient,     // RECV_B: the gradient of the stage's output, from the next stage's rank
  reduce_gradients,  // REDUCE: start the data-parallel reduction of the stage's gradients
  optimizer_step,    // STEP: the optimizer step of every stage on the rank
};
inline constexpr int kNumActionKinds = 10;

// A plain value the executor switches on. `stage` is the global stage (chunk)
// index, 0 <= stage < Schedule::num_stages(); a send or receive names the stage on the
// acting rank (SEND_F of stage s carries s's output to stage s+1, RECV_F of stage s its
// input from stage s-1). `peer` is the other rank of a transfer and always equals what
// the placement implies (the parsers and passes fill it in); -1 elsewhere.
//
// A composite OVERLAP_F_B (DualPipe's forward of one micro-batch run beside the
// backward of another, PyTorch's "(0F7;7B3)OVERLAP_F_B") is two adjacent actions of one
// rank's list: an F with `overlap` set, then its partner B or BW. Each half is an
// ordinary action to the validator (both must be valid and in order); the pair starts
// when both halves' inputs are there and takes the cost file's `overlap_f_b` time; the
// executor runs the forward, then the backward.
struct Action {
  ActionKind kind = ActionKind::forward;
  int32_t micro_batch = -1;  // -1 for REDUCE and STEP
  int32_t stage = -1;        // -1 for STEP
  int32_t peer = -1;
  bool overlap = false;  // an F that starts together with the next action (OVERLAP_F_B)

  friend bool operator==(const Action&, const Action&) = default;
};

inline bool is_compute(ActionKind k) {
  return k <= ActionKind::full_backward;
}
inline bool is_send(ActionKind k) {
  return k == ActionKind::send_activation || k == ActionKind::send_gradient;
}
inline bool is_recv(ActionKind k) {
  return k == ActionKind::recv_activation || k == ActionKind::recv_gradient;
}
inline bool is_transfer(ActionKind k) {
  return is_send(k) || is_recv(k);
}
// The kinds that carry a micro-batch number (all but REDUCE and STEP).
inline bool has_micro_batch(ActionKind k) {
  return k < ActionKind::reduce_gradients;
}

// "F", "B", "W", "BW", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE", "STEP".
std::string_view kind_code(ActionKind k);
std::optional<ActionKind> kind_from_code(std::string_view code);
// Human words for messages: "forward", "input gradient", ...
std::string_view kind_words(ActionKind k);

// "<stage><code><micro-batch>" ("1F3", "0SEND_F2"), "<stage>REDUCE", "STEP".
std::string to_token(const Action& a);
// The text form of a composite: "(0F7;7BW3)" for an overlapped F and its partner.
std::string composite_token(const Action& forward, const Action& backward);
// The inverse of to_token; peer stays -1. Throws InputError naming `where` and what was
// expected.
Action parse_token(std::string_view token, const std::string& where);
// A composite "(0F7;7BW3)" (no spaces): the forward, marked `overlap`, then the backward
// it runs beside. Throws InputError naming `where`.
std::pair<Action, Action> parse_composite(std::string_view token, const std::string& where);

inline Action make_action(ActionKind k, int micro_batch, int stage) {
  return Action{k, micro_batch, stage, -1};
}

}  // namespace baton::schedule

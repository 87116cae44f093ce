#include "schedule/action.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

#include "memory/error.h"
#include "schedule/detail/util.h"

namespace baton::schedule {

namespace {

constexpr std::array<std::string_view, kNumActionKinds> kCodes = {
    "F", "B", "W", "BW", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE", "STEP"};
constexpr std::array<std::string_view, kNumActionKinds> kWords = {
    "forward",       "input gradient",   "weight gradient",
    "full backward", "activation send",  "activation receive",
    "gradient send", "gradient receive", "gradient reduction",
    "optimizer step"};

}  // namespace

std::string_view kind_code(ActionKind k) {
  return static_cast<size_t>(k) < kCodes.size() ? kCodes[static_cast<size_t>(k)] : "?";
}
std::string_view kind_words(ActionKind k) {
  return static_cast<size_t>(k) < kWords.size() ? kWords[static_cast<size_t>(k)] : "unknown action";
}

std::optional<ActionKind> kind_from_code(std::string_view code) {
  for (size_t i = 0; i < kCodes.size(); ++i)
    if (kCodes[i] == code) return static_cast<ActionKind>(i);
  return std::nullopt;
}

std::string to_token(const Action& a) {
  if (a.kind == ActionKind::optimizer_step) return "STEP";
  std::string s = std::to_string(a.stage);
  s += kind_code(a.kind);
  if (has_micro_batch(a.kind)) s += std::to_string(a.micro_batch);
  return s;
}

std::string composite_token(const Action& forward, const Action& backward) {
  return "(" + to_token(forward) + ";" + to_token(backward) + ")";
}

Action parse_token(std::string_view token, const std::string& where) {
  auto fail = [&](const std::string& why) -> Action {
    throw InputError(where + ": bad action '" + brief(token) + "': " + why +
                     " (expected <stage><kind><micro-batch> such as 1F3, 0B2, 2W0, 1BW4, "
                     "0SEND_F3, 1RECV_F3, 1SEND_B3, 0RECV_B3; or <stage>REDUCE; or STEP)");
  };
  if (token == "STEP") return Action{ActionKind::optimizer_step, -1, -1, -1};
  size_t i = 0;
  while (i < token.size() && std::isdigit(static_cast<unsigned char>(token[i]))) ++i;
  size_t j = i;
  // Letters of either case, so that "0f0" names its kind 'f' (kinds are upper case).
  while (j < token.size() &&
         (std::isalpha(static_cast<unsigned char>(token[j])) || token[j] == '_'))
    ++j;
  std::string_view stage_text = token.substr(0, i), code = token.substr(i, j - i),
                   mb_text = token.substr(j);
  auto stage = detail::parse_index(stage_text);
  if (!stage) return fail("it does not start with a stage number");
  if (*stage > detail::kMaxIndex) return fail(detail::too_large("stage", stage_text));
  auto kind = kind_from_code(code);
  if (!kind) {
    std::string upper(code);
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    return fail("unknown kind '" + brief(code) + "'" +
                (kind_from_code(upper) ? " (kinds are upper case: '" + upper + "')" : ""));
  }
  if (*kind == ActionKind::optimizer_step) return fail("STEP takes no stage");
  if (*kind == ActionKind::reduce_gradients) {
    if (!mb_text.empty()) return fail("REDUCE takes no micro-batch");
    return Action{*kind, -1, int32_t(*stage), -1};
  }
  auto mb = detail::parse_index(mb_text);
  if (!mb)
    return fail(mb_text.empty() ? "the micro-batch number is missing"
                                : "'" + brief(mb_text) + "' is not a micro-batch number");
  if (*mb > detail::kMaxIndex) return fail(detail::too_large("micro-batch", mb_text));
  return Action{*kind, int32_t(*mb), int32_t(*stage), -1};
}

std::pair<Action, Action> parse_composite(std::string_view token, const std::string& where) {
  const size_t semi = token.find(';'), close = token.find(')');
  if (token.empty() || token.front() != '(' || semi == std::string_view::npos ||
      close != token.size() - 1 || semi > close ||
      token.find_first_of(" \t\r\n") != std::string_view::npos)
    throw InputError(where + ": bad composite '" + std::string(token) +
                     "' (expected (<forward>;<backward>) such as (0F7;7BW3), no spaces)");
  Action f = parse_token(token.substr(1, semi - 1), where);
  Action b = parse_token(token.substr(semi + 1, close - semi - 1), where);
  f.overlap = true;
  return {f, b};
}

}  // namespace baton::schedule

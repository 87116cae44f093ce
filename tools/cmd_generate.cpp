// `baton generate`: samples a continuation from a trained checkpoint or a Hugging Face
// model on one process with a key/value cache; greedy at temperature 0. Prompts and
// output are text for byte-level models (vocabulary 256) and for SentencePiece
// tokenizers (--tokenizer), token ids otherwise (and whenever the prompt is given as ids).
// Stops at the model's end-of-sequence token, as transformers does (--ignore-eos goes on).
// Prints tokens/s at the end.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#ifdef BATON_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include "memory/error.h"
#include "stages/generate.h"
#include "stages/sentencepiece_model.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

int run_generate(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string model, checkpoint, init_from, prompt, prompt_ids, tokenizer, bos = "auto";
  std::string seed_text = "0";
  int64_t max_new = 32, top_k = 0;
  double temperature = 0, top_p = 1;
  bool ignore_eos = false;
  opts.add_options()("model", po::value(&model),
                     "model JSON (default: the checkpoint's, or --init-from's config.json)")(
      "checkpoint", po::value(&checkpoint),
      "a checkpoint directory (its newest complete checkpoint) or one step-* directory")(
      "init-from", po::value(&init_from),
      "a Hugging Face model directory (config.json + safetensors)")(
      "prompt", po::value(&prompt),
      "prompt text (byte-level models, or with --tokenizer; an empty one only after the "
      "tokenizer's beginning-of-sequence id: --bos)")("prompt-ids", po::value(&prompt_ids),
                                                      "prompt as token ids: 1,2,3")(
      "max-new-tokens", po::value(&max_new)->default_value(32), "tokens to generate")(
      "temperature", po::value(&temperature)->default_value(0.0),
      "0: greedy; otherwise sample from softmax(logits / T) (inf: uniformly among the tokens "
      "top-k and top-p keep; nan is refused)")("top-k", po::value(&top_k)->default_value(0),
                                               "sample among the k most likely tokens (0: all)")(
      "top-p", po::value(&top_p)->default_value(1.0),
      "sample among the most likely tokens whose probability reaches p")(
      "seed", po::value(&seed_text)->default_value("0"), "sampling seed, in [0, 2^64)")(
      "tokenizer", po::value(&tokenizer),
      "a SentencePiece model file (tokenizer.model) for text prompts and output")(
      "bos", po::value(&bos)->default_value("auto"),
      "start a --prompt with the tokenizer's beginning-of-sequence id: yes, no, or auto (yes "
      "for --init-from, as Hugging Face's LLaMA tokenizers do; no for --checkpoint, as "
      "baton data prepare writes none)")(
      "ignore-eos", po::bool_switch(&ignore_eos),
      "go on past an end-of-sequence token (by default the output ends with the first one, "
      "as transformers' generate does: the eos_token_id of generation_config.json, else of "
      "config.json; for a checkpoint of a shorthand model, the --tokenizer's)");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton generate (--checkpoint DIR | --init-from HF_DIR) (--prompt TEXT | "
                  "--prompt-ids 1,2,3) [options]",
                  opts, vm))
    return 0;
  apply_common_options(vm);
  check_path_flags(vm, {"model", "checkpoint", "init-from", "tokenizer"});
  // Given, not non-empty: --prompt "" had been told to give one of the two.
  const bool text_prompt = vm.count("prompt") > 0;
  if (text_prompt == (vm.count("prompt-ids") > 0))
    throw InputError("give exactly one of --prompt and --prompt-ids");
  const uint64_t seed = parse_uint64_option("--seed", seed_text);
  if (max_new < 1)
    throw InputError("--max-new-tokens: expected at least 1, found " + std::to_string(max_new));
  // Written so that NaN, which fails every comparison, is refused too.
  if (!(temperature >= 0))
    throw InputError(fmt::format("--temperature: expected a value >= 0, found {:g}", temperature));
  if (top_k < 0) throw InputError("--top-k: expected a value >= 0, found " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1))
    throw InputError(fmt::format("--top-p: expected a value in (0, 1], found {:g}", top_p));
  // Greedy decoding draws nothing: a seed there would change nothing, as top-k/top-p.
  const bool seed_given = !vm["seed"].defaulted();
  if (temperature == 0 && (top_k != 0 || top_p != 1 || seed_given))
    throw InputError(std::string(top_k != 0   ? "--top-k"
                                 : top_p != 1 ? "--top-p"
                                              : "--seed") +
                     " only acts when sampling: give --temperature above 0 (0 is greedy)");
  if (bos != "auto" && bos != "yes" && bos != "no")
    throw InputError("--bos: expected yes, no or auto, found '" + bos + "'");
  // With a tokenizer too: --bos had been applied to text prompts only, and ignored here.
  if (bos != "auto" && !text_prompt)
    throw InputError("--bos " + bos +
                     " applies to a --prompt text: ids given by --prompt-ids are taken as they "
                     "are (begin them with the beginning-of-sequence id to start with one)");
  if (bos != "auto" && tokenizer.empty())
    throw InputError("--bos " + bos +
                     " needs --tokenizer: the beginning-of-sequence id is the tokenizer's (a "
                     "--prompt without one is taken byte by byte)");
  // An empty text is a prompt only through a tokenizer's beginning-of-sequence id (--bos);
  // otherwise it would feed nothing. Refused before the model is read.
  if (text_prompt && prompt.empty() && (tokenizer.empty() || bos == "no"))
    throw InputError(
        "--prompt: the prompt is empty, nothing to continue from (an empty prompt takes "
        "--tokenizer and its beginning-of-sequence id: --bos yes)");
  if (!text_prompt && prompt_ids.empty()) throw InputError("--prompt-ids: no token ids");

  // The model (every layer on this process, from a checkpoint of any plan or a Hugging
  // Face directory); the KV-cache loop and the sampling are stages::generate's.
  stages::GenerationModel m =
      stages::load_generation_model(checkpoint, init_from, model, temperature > 0);
  const stages::Stage& stage = *m.stage;
  std::vector<int32_t> ids;
#ifdef BATON_HAVE_SENTENCEPIECE
  sentencepiece::SentencePieceProcessor sp;
#endif
  bool have_sp = false;
  if (!tokenizer.empty()) {
#ifdef BATON_HAVE_SENTENCEPIECE
    // Read and checked by baton first: the library reads past a corrupt model.
    auto status = sp.LoadFromSerializedProto(stages::read_sentencepiece_model(tokenizer));
    if (!status.ok())
      throw InputError(tokenizer + ": not a SentencePiece model: " + status.ToString());
    // A model's vocabulary may be padded beyond its tokenizer's pieces, never short of it.
    if (int64_t(sp.GetPieceSize()) > m.vocab_size)
      throw InputError(tokenizer + ": has " + std::to_string(sp.GetPieceSize()) +
                       " pieces, more than the model's vocabulary of " +
                       std::to_string(m.vocab_size) + " (not the model's tokenizer?)");
    have_sp = true;
#else
    throw InputError(
        "--tokenizer: this build of baton has no SentencePiece (libsentencepiece-dev)");
#endif
  }
  const int64_t vocab = m.vocab_size;
  const bool bytes = !have_sp && vocab == 256;
  if (!text_prompt) {
    for (int64_t id : parse_int_list(
             prompt_ids, "--prompt-ids", 0, vocab - 1,
             "token ids of the model's vocabulary [0, " + std::to_string(vocab) + ") like 1,2,3"))
      ids.push_back(int32_t(id));
  } else if (have_sp) {
#ifdef BATON_HAVE_SENTENCEPIECE
    std::vector<int> v;
    if (auto status = sp.Encode(prompt, &v); !status.ok())
      throw InputError(tokenizer + ": cannot encode the prompt: " + status.ToString());
    const bool add_bos = bos == "yes" || (bos == "auto" && !init_from.empty());
    if (add_bos && sp.bos_id() < 0)
      throw InputError("--bos yes: " + tokenizer + " has no beginning-of-sequence piece");
    if (add_bos) ids.push_back(sp.bos_id());
    for (int t : v) ids.push_back(int32_t(t));
    if (ids.empty())
      throw InputError(prompt.empty()
                           ? std::string("--prompt: the prompt is empty, nothing to continue "
                                         "from (--bos yes starts it with the tokenizer's "
                                         "beginning-of-sequence id)")
                           : "--prompt: " + tokenizer +
                                 " encodes it to no tokens (only spaces?); give --bos yes to "
                                 "start from the beginning-of-sequence id, or a prompt with "
                                 "text");
#endif
  } else if (bytes) {
    for (unsigned char ch : prompt) ids.push_back(int32_t(ch));
  } else {
    throw InputError(
        "--prompt needs a byte-level model (vocabulary 256) or --tokenizer; this "
        "model's vocabulary is " +
        std::to_string(vocab) + ": give --prompt-ids");
  }

  // The model's end-of-sequence ids, else (a shorthand model) the tokenizer's.
  int32_t tokenizer_eos = -1;
#ifdef BATON_HAVE_SENTENCEPIECE
  if (have_sp) tokenizer_eos = int32_t(sp.eos_id());
#endif
  const std::vector<int32_t> known_stop = m.stop_ids(tokenizer_eos);
  // Not an error: the output is the same either way, but the user may expect an EOS.
  if (ignore_eos && known_stop.empty())
    spdlog::warn(
        "--ignore-eos: no end-of-sequence id is known (none in the model's config, and no "
        "--tokenizer), so there is none to ignore: generation runs to --max-new-tokens anyway");
  const std::vector<int32_t> stop = ignore_eos ? std::vector<int32_t>{} : known_stop;
  stages::SampleOptions so{temperature, top_k, top_p, seed};
  stages::GenerationTimes times;
  std::vector<int32_t> out = stages::generate(stage, ids, max_new, so, stop, &times);

  // Text in, text out; ids in, ids out.
  if (bytes && text_prompt) {
    std::string text;
    for (int32_t t : out) text.push_back(char(t));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  } else if (have_sp && text_prompt) {
#ifdef BATON_HAVE_SENTENCEPIECE
    std::vector<int> v(out.begin(), out.end());
    for (int t : v)
      if (t >= sp.GetPieceSize())
        throw InputError("the model generated token " + std::to_string(t) + ", beyond the " +
                         std::to_string(sp.GetPieceSize()) + " pieces of " + tokenizer +
                         " (not the tokenizer the model was trained with?); the ids: " + [&] {
                           std::string list;
                           for (size_t i = 0; i < out.size(); ++i)
                             list += (i ? "," : "") + std::to_string(out[i]);
                           return list;
                         }());
    // What follows the decoded prompt in the decoded whole: decoded alone, the first new
    // piece had lost its leading "▁" ("the quick" + "▁gradient" printed "gradient"). A
    // prompt whose decoding is no prefix of the whole's: the new ids alone.
    auto decode = [&](const std::vector<int>& pieces) {
      std::string text;
      if (auto status = sp.Decode(pieces, &text); !status.ok())
        throw RuntimeError(tokenizer + ": cannot decode the output: " + status.ToString());
      return text;
    };
    std::vector<int> whole(ids.begin(), ids.end());
    const std::string head = decode(whole);
    whole.insert(whole.end(), v.begin(), v.end());
    std::string text = decode(whole);
    text = text.starts_with(head) ? text.substr(head.size()) : decode(v);
    std::printf("%s\n", text.c_str());
#endif
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  std::fflush(stdout);
  // Log lines: --log-level warn or off silences them (they had been printed at any level).
  if (int64_t(out.size()) < max_new)
    spdlog::info("stopped at the end-of-sequence token {} (--ignore-eos goes on)", out.back());
  // The prompt's pass apart from the tokens after it: counted together, a long prompt had
  // made the rate read 3 tokens/s where the tokens came at 80.
  const double rest = times.total_s - times.first_token_s;
  spdlog::info("{} prompt + {} new tokens in {:.3f} s: first token after {:.3f} s{}", ids.size(),
               out.size(), times.total_s, times.first_token_s,
               out.size() > 1 && rest > 0
                   ? fmt::format(", then {:.1f} tokens/s", double(out.size() - 1) / rest)
                   : std::string());
  return 0;
}

const RegisterCommand register_generate{
    {"generate", "sample a continuation from a checkpoint or a Hugging Face model", run_generate}};

}  // namespace
}  // namespace baton::tools

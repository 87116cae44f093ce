// `baton data`: datasets for `baton train --data`.
//   inspect PATH            what a dataset holds (format, dtype, documents, tokens, the
//                           smallest and largest token, a few samples, decoded with
//                           --tokenizer)
//   prepare                 tokenizes a corpus (one document per line of a text file or
//                           per JSON record of a .jsonl or .json) with a SentencePiece model into
//                           Megatron-LM's indexed format
//   train-tokenizer         trains a SentencePiece model on a corpus
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/loop.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/json_object.h"
#include "memory/utf8.h"
#include "stages/data.h"
#include "stages/image_data.h"
#include "stages/sentencepiece_model.h"
#include "stages/token_store.h"
#include "tools/command.h"

#ifdef BATON_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace baton::tools {
namespace {

using stages::TokenStore;

#ifdef BATON_HAVE_SENTENCEPIECE
std::unique_ptr<sentencepiece::SentencePieceProcessor> load_tokenizer(const std::string& path) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // Read and checked by baton first: the library reads past a corrupt model.
  auto st = sp->LoadFromSerializedProto(stages::read_sentencepiece_model(path));
  if (!st.ok())
    throw InputError(path + ": not a SentencePiece model (--tokenizer): " + st.ToString());
  return sp;
}
#endif

#ifndef BATON_HAVE_SENTENCEPIECE
[[noreturn]] void no_sentencepiece(const std::string& what) {
  throw InputError(what +
                   " needs SentencePiece, and this baton was built without libsentencepiece-dev");
}
#endif

#ifdef BATON_HAVE_SENTENCEPIECE
// SentencePiece does not check the writes of TMP.model and TMP.vocab: a full disk left an
// empty .vocab that replaced an earlier good one (exit 0), or a cut .model blamed on
// --tokenizer (exit 2). Both are read back before they replace PREFIX's pair: the .model
// loads and is as long as its contents, the .vocab has a line per piece. Returns the
// piece count; RuntimeError naming the output otherwise.
int check_trained_tokenizer(const std::string& tmp, const std::string& out) {
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.Load(tmp + ".model");
  if (!st.ok())
    throw RuntimeError(out + ".model: the trained model did not read back from " + tmp +
                       ".model (was the disk full?): " + st.ToString());
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(tmp + ".model", ec);
  const size_t want = sp.serialized_model_proto().size();
  if (ec || size != want)
    throw RuntimeError(out + ".model: " + tmp + ".model holds " +
                       (ec ? ec.message() : std::to_string(size) + " bytes") + ", expected " +
                       std::to_string(want) + " (was the disk full?)");
  const int pieces = sp.GetPieceSize();
  std::ifstream vocab(tmp + ".vocab", std::ios::binary);
  int64_t lines = 0;
  std::string line;
  while (std::getline(vocab, line)) ++lines;
  if (!vocab.eof() || lines != pieces)
    throw RuntimeError(out + ".vocab: " + tmp + ".vocab holds " + std::to_string(lines) +
                       " lines, expected one per piece (" + std::to_string(pieces) +
                       ") (was the disk full?)");
  return pieces;
}

// Throws InputError unless PREFIX's files can be written: its directory exists and is
// writable (SentencePiece had said only "Permission denied").
void check_output_prefix(const std::string& prefix, const std::string& longest_ext) {
  namespace fs = std::filesystem;
  // "dir/" or "." had written dir/.bin or ..bin: hidden files with no name.
  const std::string name_part = fs::path(prefix).filename().string();
  if (name_part.empty() || name_part == "." || name_part == "..")
    throw InputError("--out " + prefix + ": expected a prefix ending in a file name (" + prefix +
                     "NAME), found a directory");
  const fs::path parent = fs::path(prefix).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError("--out " + prefix + ": no directory " + dir + " to write it in");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError("--out " + prefix + ": cannot write in " + dir + ": " + std::strerror(errno));
  // The file system's limit on a name, before the work: a longer PREFIX.model had failed
  // at its rename after the whole run.
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name = fs::path(prefix).filename().string().size() + longest_ext.size();
  if (name_max > 0 && name > size_t(name_max))
    throw InputError("--out " + prefix + ": the file name " + fs::path(prefix).filename().string() +
                     longest_ext + " is " + std::to_string(name) +
                     " bytes, over the file system's limit of " + std::to_string(name_max));
}

// Throws InputError when `input` (--input) is a directory: reading one had said "read error"
// (prepare) or "no text to train on" (train-tokenizer); or a compressed file, whose bytes
// had been tokenized as text (corpus.txt.gz: 37% <unk>, exit 0). Only a regular file's
// first bytes are read: a FIFO or /dev/stdin is read once, by the command.
void check_input_file(const std::string& input, const std::string& expected) {
  std::error_code ec;
  if (std::filesystem::is_directory(input, ec))
    throw InputError("--input " + input + ": a directory, expected " + expected);
  if (!std::filesystem::is_regular_file(input, ec)) return;
  std::ifstream in(input, std::ios::binary);
  std::array<char, 6> head{};
  in.read(head.data(), std::streamsize(head.size()));
  const std::string_view start(head.data(), size_t(in.gcount()));
  struct Compressed {
    std::string_view magic;
    const char* kind;
    const char* tool;
  };
  static constexpr Compressed kFormats[] = {
      {std::string_view("\x1f\x8b", 2), "gzip", "gunzip -k"},
      {std::string_view("\x28\xb5\x2f\xfd", 4), "zstd", "zstd -d"},
      {std::string_view("\xfd"
                        "7zXZ\0",
                        6),
       "xz", "unxz -k"}};  // none of them UTF-8
  for (const Compressed& c : kFormats)
    if (start.starts_with(c.magic))
      throw InputError("--input " + input + ": " + c.kind + "-compressed data, expected " +
                       expected + ": decompress it first (" + c.tool + ")");
}

// Whether `text` is only whitespace as Python's str.isspace has it (U+0085, U+2028 and
// U+3000 among them), the lines tools/hf_tokenize.py skips: a model that keeps them (an
// identity normalisation, byte fallback) had made documents of them. Not UTF-8: false.
bool only_whitespace(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t c = n == 1 ? b : n == 2 ? b & 0x1f : b & 0x0f;
    for (int k = 1; k < n; ++k) {
      const auto t = static_cast<unsigned char>(text[i + k]);
      if ((t >> 6) != 2) return false;
      c = c << 6 | (t & 0x3f);
    }
    i += n;
    const bool space = (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
                       c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
                       c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
    if (!space) return false;
  }
  return true;
}

// A JSON value for a message: its type and (short) text.
std::string found_json(const nlohmann::json& j) {
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 40) text = memory::utf8_prefix(text, 37);  // whole characters
  return std::string(j.is_array() || j.is_object() ? "an " : "a ") + j.type_name() + " (" + text +
         ")";
}
#endif

// ---- inspect ----

int run_inspect(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string path, format, token_dtype, tokenizer;
  int64_t samples = 3, show = 48, vocab = 0;
  opts.add_options()("path", po::value(&path)->required(),
                     "the dataset (as for baton train --data)")(
      "data-format", po::value(&format)->default_value("auto"), "auto, megatron, tokens or text")(
      "token-dtype", po::value(&token_dtype),
      "flat token files: uint16 (default), uint32, or uint8, int8, int16, int32, int64")(
      "tokenizer", po::value(&tokenizer), "a SentencePiece model to decode the samples with")(
      "vocab-size", po::value(&vocab)->default_value(0),
      "check every token against a vocabulary of this size")(
      "samples", po::value(&samples)->default_value(3), "documents to show")(
      "show-tokens", po::value(&show)->default_value(48), "tokens to show of each");
  add_log_level_option(opts);
  po::positional_options_description pos;
  pos.add("path", 1);
  po::variables_map vm;
  if (!parse_args(args, "baton data inspect PATH [--tokenizer FILE.model]", opts, vm, &pos))
    return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  check_path_flags(vm, {"path", "tokenizer"});
  // Negative counts had failed deep inside (a vector of -5 tokens) or been taken as none.
  for (auto [flag, v] : {std::pair<const char*, int64_t>{"--samples", samples},
                         {"--show-tokens", show},
                         {"--vocab-size", vocab}})
    if (v < 0)
      throw InputError(std::string(flag) + ": expected a count >= 0, found " + std::to_string(v));
  const auto t0 = std::chrono::steady_clock::now();
  // Image data (a directory with images.npy, as baton train --data reads it): had been
  // refused as "not a regular file".
  if (stages::is_image_dataset(path)) {
    if (format != "auto" || !token_dtype.empty() || !tokenizer.empty() || vocab > 0)
      throw InputError(path +
                       ": image data (images.npy, labels.npy) takes none of "
                       "--data-format, --token-dtype, --tokenizer or --vocab-size");
    const stages::ImageDataset images(path);
    std::printf("file       %s\n", path.c_str());
    std::printf("format     images\n");
    std::printf("images     %lld\n", static_cast<long long>(images.size()));
    std::printf("shape      %s (channels, height, width)\n",
                memory::shape_str(images.image_shape()).c_str());
    std::printf("classes    %lld (labels 0..%lld)\n", static_cast<long long>(images.classes()),
                static_cast<long long>(images.classes() - 1));
    return 0;
  }
  // The tokenizer loaded before any output: a bad one had come after the header.
#ifdef BATON_HAVE_SENTENCEPIECE
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp;
  if (!tokenizer.empty()) sp = load_tokenizer(tokenizer);
#else
  if (!tokenizer.empty()) no_sentencepiece("--tokenizer");
#endif
  auto s = stages::open_token_store(path, format, token_dtype);
  // Text data's ids are its bytes, shown as text already: SentencePiece would have decoded
  // them as piece ids and printed other text.
  if (s->format() == "text" && !tokenizer.empty())
    throw InputError(path + ": text data (every byte a token) takes no --tokenizer, found '" +
                     tokenizer + "'; its bytes are shown as text without one");
  if (vocab > 0) s->check_vocabulary(vocab, 0, -1, "--vocab-size's");
  spdlog::info("opened {} ({} tokens{}) in {:.3f} s", s->name(), s->num_tokens(),
               vocab > 0 ? ", every token checked against the vocabulary" : "",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const stages::TokenRange range = s->token_range();
#ifdef BATON_HAVE_SENTENCEPIECE
  if (!tokenizer.empty()) {
    // The data's fault, named by the data's file and first bad position (a negative id
    // had been SentencePiece's "Invalid id" naming the tokenizer).
    if (s->num_tokens() > 0 && (range.lo < 0 || range.hi >= sp->GetPieceSize())) {
      try {
        s->check_vocabulary(sp->GetPieceSize(), 0, -1, "the tokenizer's");
      } catch (const InputError& e) {
        throw InputError(std::string(e.what()) + " (--tokenizer " + tokenizer + ": " +
                         std::to_string(sp->GetPieceSize()) + " pieces)");
      }
    }
  }
#endif
  std::printf("file       %s\n", s->name().c_str());
  std::printf("format     %s\n", s->format().c_str());
  std::printf("dtype      %s\n", stages::token_type_name(s->type()).c_str());
  std::printf("documents  %lld\n", static_cast<long long>(s->num_documents()));
  if (s->format() == "megatron")
    std::printf("sequences  %lld\n", static_cast<long long>(s->num_sequences()));
  std::printf("tokens     %lld\n", static_cast<long long>(s->num_tokens()));
  if (s->num_tokens() > 0)
    std::printf("token ids  %s .. %s\n", range.lo_text.c_str(), range.hi_text.c_str());
  for (int64_t d = 0, shown = 0; d < s->num_documents() && shown < samples; ++d) {
    const int64_t b = s->document_start(d), len = s->document_start(d + 1) - b;
    const int64_t n = std::min(show, len);
    if (len == 0) continue;  // an empty document (--show-tokens 0 still shows the others)
    ++shown;
    std::vector<int64_t> ids(static_cast<size_t>(n));
    s->read(b, n, ids.data());
    std::string text;
    if (s->format() == "text") text.assign(ids.begin(), ids.end());
#ifdef BATON_HAVE_SENTENCEPIECE
    if (sp) {
      std::vector<int> v(ids.begin(), ids.end());
      if (auto st = sp->Decode(v, &text); !st.ok())
        throw InputError(tokenizer + ": " + st.ToString());
    }
#endif
    std::string list;
    for (int64_t id : ids) list += (list.empty() ? "" : " ") + std::to_string(id);
    std::printf("\ndocument %lld (%lld tokens): %s%s\n", static_cast<long long>(d),
                static_cast<long long>(len), list.c_str(), n < len ? (n > 0 ? " ..." : "...") : "");
    // A prefix may end inside a UTF-8 character, and text data may be any bytes: shown
    // with U+FFFD where they are no UTF-8 (dump() had thrown half-way through the report).
    if (!text.empty())
      std::printf("  %s\n", nlohmann::json(text)
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                .c_str());
  }
  return 0;
}

// ---- prepare ----

int run_prepare(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string tokenizer, input, out, key, dtype;
  bool eod = false;
  opts.add_options()("tokenizer", po::value(&tokenizer)->required(),
                     "SentencePiece model (FILE.model)")(
      "input", po::value(&input)->required(),
      "corpus: text (a document per line) or .jsonl/.json (JSON Lines: one per record)")(
      "out,o", po::value(&out)->required(), "output prefix: writes PREFIX.bin and PREFIX.idx")(
      "json-key", po::value(&key)->default_value("text"), ".jsonl: the field holding the text")(
      "token-dtype", po::value(&dtype)->default_value("auto"),
      "token type: auto (uint16 below 65500 ids, else int32), uint8, int8, int16, uint16, int32 or "
      "int64")("append-eod", po::bool_switch(&eod),
               "end every document with the tokenizer's end-of-document id");
  add_log_level_option(opts);
  po::variables_map vm;
  if (!parse_args(
          args,
          "baton data prepare --tokenizer FILE.model --input corpus.txt|corpus.jsonl --out PREFIX",
          opts, vm))
    return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  check_path_flags(vm, {"tokenizer", "input", "out"});
#ifndef BATON_HAVE_SENTENCEPIECE
  no_sentencepiece("baton data prepare");
#else
  auto sp = load_tokenizer(tokenizer);
  const int vocab = sp->GetPieceSize();
  // The integer types of Megatron's format, listed exactly (parse_token_type's message
  // names uint32 too, which the format lacks).
  const std::vector<std::string> types = {"auto",   "uint8", "int8", "int16",
                                          "uint16", "int32", "int64"};
  if (std::find(types.begin(), types.end(), dtype) == types.end())
    throw InputError(
        "--token-dtype: expected auto, uint8, int8, int16, uint16, int32 or int64 (the integer "
        "types "
        "of Megatron's format), found '" +
        dtype + "'");
  const stages::TokenType type =
      dtype == "auto" ? (vocab < 65500 ? stages::TokenType::u16 : stages::TokenType::i32)
                      : stages::parse_token_type(dtype, "--token-dtype");
  const double type_max = type == stages::TokenType::u8    ? 255
                          : type == stages::TokenType::i8  ? 127
                          : type == stages::TokenType::i16 ? 32767
                          : type == stages::TokenType::u16 ? 65535
                                                           : 2147483647.0;
  if (vocab - 1 > type_max)
    throw InputError("--token-dtype " + stages::token_type_name(type) + " cannot hold " +
                     tokenizer + "'s " + std::to_string(vocab) + " token ids");
  if (eod && sp->eos_id() < 0)
    throw InputError(tokenizer + ": no end-of-document piece (</s>) for --append-eod");
  check_input_file(input, "a text or JSON Lines file");
  std::ifstream in(input, std::ios::binary);
  if (!in) throw InputError(input + ": cannot open file (missing or unreadable)");
  // JSON Lines under any of its names, in any case, as tools/hf_tokenize.py reads them
  // (docs/formats/data.md): corpus.JSONL had been read as text, a document per raw line.
  std::string ext = std::filesystem::path(input).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  const bool jsonl = ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
  // A text corpus's lines are documents as they are: the key had been ignored.
  if (!jsonl && !vm["json-key"].defaulted())
    throw InputError("--json-key applies to .jsonl or .json input (JSON Lines), found --input " +
                     input + " (a text file: a document per line)");
  // "--out tok.bin" names the pair's data file: its prefix is tok (tok.bin.bin and
  // tok.bin.idx had been written, which --data tok.bin did not find).
  {
    // Lower case, as --data finds the pair by its .bin.
    const std::string name = std::filesystem::path(out).filename().string();
    const bool suffix = name.ends_with(".bin") || name.ends_with(".idx");
    const std::string dir = out.substr(0, out.size() - name.size());
    const std::string stem = suffix ? name.substr(0, name.size() - 4) : name;
    if (suffix && (stem.empty() || stem == "." || stem == ".."))
      throw InputError("--out " + out + ": expected a prefix ending in a file name (" + dir +
                       "NAME writes " + dir + "NAME.bin and " + dir + "NAME.idx)");
    if (suffix) out.resize(out.size() - 4);
  }
  check_output_prefix(out, ".bin");
  // A corpus named PREFIX.bin had been replaced by its own tokens, exit 0.
  engine::check_distinct_files({{"--out", out + ".bin"},
                                {"--out", out + ".idx"},
                                {"--input", input},
                                {"--tokenizer", tokenizer}},
                               2);
  // Ctrl-C or a scheduler's SIGTERM stops it between lines, its temporary .bin removed
  // (the writer, unfinished): it had been left behind, of any size.
  const engine::StopSignals stop(true);
  stages::IndexedDatasetWriter w(out, type);
  std::string line;
  int64_t line_no = 0, skipped = 0;
  std::vector<int> ids;
  while (std::getline(in, line)) {
    if (const int sig = stop.received()) {
      spdlog::warn(
          "{}: stopped by {} at line {} of {}: nothing written (an earlier pair is "
          "untouched)",
          out, engine::signal_text(sig), line_no, input);
      return 128 + sig;
    }
    ++line_no;
    // A CRLF line's "\r" is no part of it (an identity-normalising model had kept it as a
    // token), as tools/hf_tokenize.py reads it.
    if (line.ends_with('\r')) line.pop_back();
    std::string text = line;
    if (jsonl) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = input + ":" + std::to_string(line_no);
      // nlohmann skips a byte order mark at the start of every input, here every line:
      // only the file's may have one, as for tools/hf_tokenize.py and Python's json.
      if (line_no > 1 && line.starts_with("\xEF\xBB\xBF"))
        throw InputError(where +
                         ": expected a JSON object per line, found invalid JSON: a UTF-8 byte "
                         "order mark at column 1 (only the file's first line may start with one)");
      nlohmann::json j;
      try {
        j = memory::parse_json_text(line, where);
      } catch (const InputError& e) {
        // nlohmann's reason and column kept (an unpaired surrogate escape, a byte that is no
        // UTF-8): the line had been called no JSON object without saying why. Its "line 1"
        // is the line's own, not the file's.
        std::string why = e.what();
        const std::string lead = where + ": not valid JSON: ";
        if (!why.starts_with(lead)) throw;  // a repeated key, named by its path
        why = why.substr(lead.size());
        if (why.starts_with("parse error at line 1, ")) why = "parse error at " + why.substr(23);
        if (const size_t at = why.find(" at line 1, column "); at != std::string::npos)
          why.replace(at, 19, " at column ");
        throw InputError(where + ": expected a JSON object per line, found invalid JSON: " + why);
      }
      if (!j.is_object())
        throw InputError(where + ": expected a JSON object per line, found " + found_json(j));
      if (!j.contains(key))
        throw InputError(where + ": no field \"" + key +
                         "\" (--json-key names the field holding the text)");
      if (!j[key].is_string())
        throw InputError(where + ": $." + key + ": expected a string (--json-key), found " +
                         found_json(j[key]));
      text = j[key].get<std::string>();
    }
    // Empty or only whitespace: skipped, as tools/hf_tokenize.py does, whatever the model
    // makes of it.
    if (only_whitespace(text)) {
      ++skipped;
      continue;
    }
    if (auto st = sp->Encode(text, &ids); !st.ok())
      throw InputError(input + ":" + std::to_string(line_no) + ": " + st.ToString());
    // A text that encodes to nothing: skipped, with or without --append-eod (as Megatron's
    // preprocess_data.py does), not a document of only the end-of-document token.
    if (ids.empty()) {
      ++skipped;
      continue;
    }
    std::vector<int64_t> doc(ids.begin(), ids.end());
    if (eod) doc.push_back(sp->eos_id());
    w.add_document(doc);
  }
  if (in.bad()) throw InputError(input + ": read error");
  if (w.documents() == 0) throw InputError(input + ": no documents (every line empty or blank)");
  w.finish();
  spdlog::info("{}.bin, {}.idx: {} documents, {} tokens ({}, vocabulary {}){}", out, out,
               w.documents(), w.tokens(), stages::token_type_name(type), vocab,
               skipped ? fmt::format("; {} empty or blank lines skipped", skipped) : std::string());
  return 0;
#endif
}

// ---- train-tokenizer ----

int run_train_tokenizer(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string input, out, model_type;
  int64_t vocab = 0, max_lines = 0;
  double coverage = 1.0;
  opts.add_options()("input", po::value(&input)->required(),
                     "corpus: text, one sentence or document per line")(
      "out,o", po::value(&out)->required(), "output prefix: writes PREFIX.model and PREFIX.vocab")(
      "vocab-size", po::value(&vocab)->default_value(1024), "vocabulary size")(
      "model-type", po::value(&model_type)->default_value("bpe"), "bpe, unigram, char or word")(
      "character-coverage", po::value(&coverage)->default_value(1.0),
      "share of characters the vocabulary covers")(
      "max-lines", po::value(&max_lines)->default_value(0),
      "train on at most this many non-empty lines (0: all)");
  add_log_level_option(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton data train-tokenizer --input corpus.txt --out PREFIX [--vocab-size N]",
                  opts, vm))
    return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  check_path_flags(vm, {"input", "out"});
#ifndef BATON_HAVE_SENTENCEPIECE
  no_sentencepiece("baton data train-tokenizer");
#else
  // SentencePiece's own limits, checked first: its errors name neither the flag nor the
  // file, and a negative --max-lines had silently meant every line.
  if (vocab < 8)
    throw InputError("--vocab-size: expected at least 8, found " + std::to_string(vocab));
  // SentencePiece's int: beyond it, its own "cannot parse" had named no flag.
  if (vocab > 2147483647)
    throw InputError("--vocab-size: expected at most 2147483647 (SentencePiece's limit), found " +
                     std::to_string(vocab));
  if (model_type != "bpe" && model_type != "unigram" && model_type != "char" &&
      model_type != "word")
    throw InputError("--model-type: expected bpe, unigram, char or word, found '" + model_type +
                     "'");
  if (!(coverage >= 0.98 && coverage <= 1))
    throw InputError(
        "--character-coverage: expected a share in [0.98, 1] (SentencePiece's "
        "range), found " +
        fmt::format("{}", coverage));
  if (max_lines != 0 && max_lines <= 100)
    throw InputError(
        "--max-lines: expected 0 (every line) or more than 100 (SentencePiece's least), found " +
        std::to_string(max_lines));
  check_output_prefix(out, ".model");
  engine::check_distinct_files(
      {{"--out", out + ".model"}, {"--out", out + ".vocab"}, {"--input", input}}, 2);
  check_input_file(input, "a text file");
  // Read twice (the longest line below, then SentencePiece's training): a pipe had given
  // SentencePiece nothing, and its internal check the only message.
  if (struct stat st; ::stat(input.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw InputError("--input " + input + ": " + memory::file_kind(st.st_mode) +
                     ", expected a regular file: train-tokenizer reads its input twice");
  // SentencePiece writes TMP.model and TMP.vocab, renamed to PREFIX's names once both are
  // complete: a failed run (PREFIX.vocab a directory) had left a new PREFIX.model in
  // place of an earlier one. A name that is no file to write is refused before the work.
  // PREFIX.tmp, or a hidden hashed prefix where PREFIX.tmp.model would pass the system's
  // limit on a name (a legal PREFIX.model had failed at its temporary name).
  std::string tmp = memory::temp_path_beside(out, ".tmp.model");
  tmp.resize(tmp.size() - std::string(".model").size());
  for (const std::string& name : {out + ".model", out + ".vocab", tmp + ".model", tmp + ".vocab"}) {
    std::error_code ec;
    const auto st = std::filesystem::status(name, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      throw InputError("--out " + out + ": " + name + " is " +
                       (std::filesystem::is_directory(st) ? "a directory" : "not a regular file") +
                       ", expected a file to write (or none)");
  }
  // SentencePiece skips every line longer than its max_sentence_length (4192 bytes by
  // default) with only a log line, and fails on a corpus of such lines: the limit is the
  // longest line, so that every line is trained on.
  size_t longest = 0;
  {
    std::ifstream probe(input, std::ios::binary);
    if (!probe) throw InputError(input + ": cannot open file (missing or unreadable)");
    std::string line;
    bool text = false;
    int64_t line_no = 0;
    while (std::getline(probe, line)) {
      ++line_no;
      text = text || line.find_first_not_of(" \t\r\f\v") != std::string::npos;
      if (line.size() > size_t(INT32_MAX))
        throw InputError(input + ":" + std::to_string(line_no) + ": a line of " +
                         std::to_string(line.size()) +
                         " bytes, more than SentencePiece's limit of 2^31 - 1 (split the "
                         "corpus into shorter lines)");
      longest = std::max(longest, line.size());
    }
    if (probe.bad()) throw InputError(input + ": read error");
    if (!text) throw InputError(input + ": no text to train on (every line empty or blank)");
  }
  std::unordered_map<std::string, std::string> kw = {
      {"input", input},
      {"model_prefix", tmp},
      {"max_sentence_length", std::to_string(std::max<size_t>(longest, 4192))},
      {"vocab_size", std::to_string(vocab)},
      {"model_type", model_type},
      {"character_coverage", std::to_string(coverage)},
      {"num_threads", "1"},
      {"minloglevel", "1"},
      // A fixed order of the input lines: the same corpus gives the same model.
      {"shuffle_input_sentence", "false"},
  };
  if (max_lines > 0) kw["input_sentence_size"] = std::to_string(max_lines);
  auto remove_tmp = [&] {
    std::error_code ec;
    std::filesystem::remove(tmp + ".model", ec);
    std::filesystem::remove(tmp + ".vocab", ec);
  };
  int pieces = 0;
  const memory::RemoveOnStop on_stop({tmp + ".model", tmp + ".vocab"});
  try {
    auto st = sentencepiece::SentencePieceTrainer::Train(kw);
    if (!st.ok()) {
      // SentencePiece's "Vocabulary size too high (N). Please set it to a value <= M." names
      // neither the flag nor the file; M of 3 is its meta pieces alone: no text at all once
      // normalised (a corpus of U+3000 or NULs had passed the check for text above).
      const std::string why = st.ToString();
      const std::string mark = "Please set it to a value <= ";
      if (const size_t at = why.find(mark);
          why.find("Vocabulary size too high") != std::string::npos && at != std::string::npos) {
        const std::string most = why.substr(at + mark.size(), why.find('.', at) - at - mark.size());
        if (most == "3")
          throw InputError(input +
                           ": no text to train on after SentencePiece's normalisation "
                           "(every line blank, control characters or such) for --vocab-size " +
                           std::to_string(vocab));
        // Below the least --vocab-size takes, "at most M" had sent the user to a value the
        // flag then refused.
        if (std::stoll(most) < 8)
          throw InputError(input + ": too little text for a tokenizer: SentencePiece's " +
                           model_type + " model of this corpus has at most " + most +
                           " pieces, fewer than the least --vocab-size (8), after its "
                           "normalisation; give a larger corpus");
        throw InputError("--vocab-size: expected at most " + most + " for " + input + " (" +
                         model_type + ": SentencePiece's limit for this corpus), found " +
                         std::to_string(vocab));
      }
      // "Vocabulary size is smaller than required_chars. 64 vs 85. ... --character_coverage
      // option": SentencePiece's own flag name, which baton spells otherwise.
      const std::string chars = "smaller than required_chars. ";
      if (const size_t at = why.find(chars); at != std::string::npos) {
        const size_t vs = why.find(" vs ", at);
        const std::string need =
            vs == std::string::npos ? "" : why.substr(vs + 4, why.find('.', vs) - vs - 4);
        if (!need.empty())
          throw InputError("--vocab-size: expected at least " + need + " for " + input + " (" +
                           model_type + ": every character kept at --character-coverage " +
                           fmt::format("{}", coverage) + " is a piece), found " +
                           std::to_string(vocab) +
                           "; or a lower --character-coverage, which maps rare characters to "
                           "<unk>");
      }
      // A write that failed (a full disk) is SentencePiece's Internal status from its
      // output streams: the host's, exit 1, naming the files (it had been exit 2, "Internal:
      // trainer_interface.cc(715) [output->WriteLine(os.str())]").
      if (st.code() == sentencepiece::util::StatusCode::kInternal &&
          (why.find("output->") != std::string::npos || why.find("Write") != std::string::npos))
        throw RuntimeError(out + ".model, " + out +
                           ".vocab: writing the tokenizer failed (a "
                           "full disk?): " +
                           why + "; any earlier pair is untouched");
      throw InputError("train-tokenizer: " + why);
    }
    pieces = check_trained_tokenizer(tmp, out);
    for (const char* ext : {".vocab", ".model"}) memory::fsync_path(tmp + ext, false);
    // The .model last: it is the file every command reads.
    for (const char* ext : {".vocab", ".model"}) {
      std::error_code ec;
      std::filesystem::rename(tmp + ext, out + ext, ec);
      if (ec)
        throw RuntimeError(out + ext + ": cannot rename " + tmp + ext + " to it: " + ec.message());
    }
  } catch (...) {
    remove_tmp();
    throw;
  }
  const std::filesystem::path dir = std::filesystem::path(out).parent_path();
  memory::fsync_path(dir.empty() ? "." : dir.string(), true);
  spdlog::info("{}.model, {}.vocab: {} pieces ({}){}", out, out, pieces, model_type,
               pieces == vocab
                   ? std::string()
                   : fmt::format("; --vocab-size asked for {}, the corpus gave {}", vocab, pieces));
  return 0;
#endif
}

int run_data(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: baton data inspect PATH [--tokenizer FILE.model]\n"
      "       baton data prepare --tokenizer FILE.model --input corpus.txt|corpus.jsonl --out "
      "PREFIX "
      "[--append-eod]\n"
      "       baton data train-tokenizer --input corpus.txt --out PREFIX [--vocab-size N]\n";
  return run_subcommand("data", args,
                        {{"inspect", run_inspect},
                         {"prepare", run_prepare},
                         {"train-tokenizer", run_train_tokenizer}},
                        usage);
}

const RegisterCommand register_data{
    {"data", "inspect, prepare (tokenize) and train tokenizers for datasets", run_data}};

}  // namespace
}  // namespace baton::tools

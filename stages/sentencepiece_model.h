// A SentencePiece model file (a serialized ModelProto) read and checked before the
// library is handed it: SentencePiece 0.1.x (Debian's) trusts the normalizer's
// precompiled character map and reads past it when it is corrupt (a tokenization that
// differed from run to run); 0.2.x refuses such a model, and so does baton.
#pragma once

#include <string>
#include <string_view>

namespace baton::stages {

// The bytes of the model at `path` (a regular file: a FIFO is refused, not waited on),
// checked by check_sentencepiece_model. Load them with LoadFromSerializedProto.
std::string read_sentencepiece_model(const std::string& path);

// InputError "<path>: not a valid SentencePiece model: <what>" unless `bytes` parse as a
// ModelProto whose pieces are non-empty and hold no NUL byte, and whose normalizer's and
// denormalizer's precompiled_charsmap (a uint32 little-endian trie size, a double-array
// trie of that many bytes, then the NUL-terminated normalized strings) stays inside
// itself: every trie index a lookup can reach lies in the trie, every value in the strings.
void check_sentencepiece_model(std::string_view bytes, const std::string& path);

}  // namespace baton::stages

#include "app/Tokenizer.h"

#include "app/SentencePiece.h"

#include "support/Error.h"
#include "support/Files.h"
#include "support/Limits.h"
#include "support/Unicode.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Base64.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/xxhash.h"

#include <fmt/format.h>
#include <map>
#include <mutex>

namespace tgc {

namespace {

/// GPT-2's map of the 256 bytes to printable characters (bytes_to_unicode): the printable
/// Latin-1 ones stand for themselves, the others take 256 + n in order.
std::vector<uint32_t> byteCharacters() {
  std::vector<uint32_t> map(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

class ByteLevelBpe : public Tokenizer {
public:
  llvm::Error load(const llvm::json::Object &json, llvm::StringRef path);
  llvm::Expected<std::vector<int32_t>> encode(llvm::StringRef text) const override;
  llvm::Expected<std::string> decode(llvm::ArrayRef<int32_t> ids) const override;
  int64_t vocabSize() const override { return int64_t(tokens_.size()); }
  std::string describe() const override {
    return fmt::format("byte-level BPE, {} tokens, {} merges", tokens_.size(), ranks_.size());
  }

private:
  /// The ids of one word (bytes), merged by rank.
  void encodeWord(llvm::StringRef word, std::vector<int32_t> &out) const;
  /// Text without added tokens: pre-tokenized, each word byte-level BPE'd.
  llvm::Error encodeText(llvm::StringRef text, std::vector<int32_t> &out) const;

  std::vector<std::string> byteChar_;       // byte -> its character, as UTF-8
  std::map<uint32_t, uint8_t> charByte_;    // the inverse, by code point
  llvm::StringMap<int32_t> vocab_;          // token (as characters) -> id
  std::vector<std::string> tokens_;         // id -> token
  std::vector<bool> added_;                 // id -> an added token (its content, not characters)
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::vector<std::pair<std::string, int32_t>> addedTokens_; // content -> id, longest first
  bool prefixSpace_ = false;
  mutable std::mutex cacheMutex_;
  mutable llvm::StringMap<std::vector<int32_t>> cache_; // word -> ids
};

llvm::Error ByteLevelBpe::load(const llvm::json::Object &json, llvm::StringRef path) {
  const llvm::json::Object *model = json.getObject("model");
  if (!model || model->getString("type") != "BPE")
    return fileContentError(path,
                            "its model is not a BPE (\"model\": {{\"type\": \"BPE\", ...}}): tgc reads byte-level BPE "
                            "tokenizers");
  for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto v = model->getString(key); v && !v->empty())
      return fileContentError(path, "the BPE's {} \"{}\": byte-level BPE has none", key, v->str());
  if (const llvm::json::Value *dropout = model->get("dropout"); dropout && dropout->kind() != llvm::json::Value::Null)
    return fileContentError(path, "the BPE's dropout: tgc encodes deterministically");
  if (const llvm::json::Value *n = json.get("normalizer"); n && n->kind() != llvm::json::Value::Null)
    return fileContentError(path, "a normalizer: tgc's byte-level BPE takes the text as it is");
  const llvm::json::Object *pre = json.getObject("pre_tokenizer");
  if (!pre || pre->getString("type") != "ByteLevel")
    return fileContentError(path, "its pre_tokenizer is not ByteLevel: tgc reads GPT-2's byte-level BPE");
  if (pre->getBoolean("use_regex") == false)
    return fileContentError(path, "its ByteLevel pre_tokenizer has use_regex false: tgc splits with GPT-2's pattern");
  prefixSpace_ = pre->getBoolean("add_prefix_space").value_or(false);
  std::vector<uint32_t> chars = byteCharacters();
  for (uint32_t b = 0; b < 256; ++b) {
    std::string c;
    appendUtf8(chars[b], c);
    byteChar_.push_back(c);
    charByte_[chars[b]] = uint8_t(b);
  }
  const llvm::json::Object *vocab = model->getObject("vocab");
  if (!vocab)
    return fileContentError(path, "the BPE has no vocab");
  for (const auto &[token, id] : *vocab) {
    auto i = id.getAsInteger();
    if (!i || *i < 0 || *i >= (1 << 24))
      return fileContentError(path, "vocab entry '{}': its id is not an integer in [0, 2^24)", token.str());
    vocab_[token] = int32_t(*i);
    if (size_t(*i) >= tokens_.size())
      tokens_.resize(size_t(*i) + 1), added_.resize(size_t(*i) + 1);
    tokens_[size_t(*i)] = token.str();
  }
  const llvm::json::Array *merges = model->getArray("merges");
  if (!merges)
    return fileContentError(path, "the BPE has no merges");
  for (size_t r = 0; r < merges->size(); ++r) {
    std::pair<std::string, std::string> pair;
    if (auto text = (*merges)[r].getAsString()) { // "a b"
      auto [a, b] = text->split(' ');
      pair = {a.str(), b.str()};
    } else if (const llvm::json::Array *two = (*merges)[r].getAsArray(); two && two->size() == 2) { // ["a", "b"]
      pair = {(*two)[0].getAsString().value_or("").str(), (*two)[1].getAsString().value_or("").str()};
    }
    if (pair.first.empty() || pair.second.empty() || !vocab_.count(pair.first + pair.second))
      return fileContentError(path, "merge {} is not two tokens whose join is in the vocab", r);
    ranks_.emplace(std::move(pair), int(r));
  }
  if (const llvm::json::Array *added = json.getArray("added_tokens"))
    for (const llvm::json::Value &v : *added) {
      const llvm::json::Object *t = v.getAsObject();
      auto content = t ? t->getString("content") : std::nullopt;
      auto id = t ? t->getInteger("id") : std::nullopt;
      if (!content || content->empty() || !id || *id < 0 || *id >= (1 << 24))
        return fileContentError(path, "an added token without content or an id in [0, 2^24)");
      addedTokens_.emplace_back(content->str(), int32_t(*id));
      if (size_t(*id) >= tokens_.size())
        tokens_.resize(size_t(*id) + 1), added_.resize(size_t(*id) + 1);
      tokens_[size_t(*id)] = content->str();
      added_[size_t(*id)] = true;
    }
  std::stable_sort(addedTokens_.begin(), addedTokens_.end(),
                   [](const auto &a, const auto &b) { return a.first.size() > b.first.size(); });
  for (uint32_t b = 0; b < 256; ++b)
    if (!vocab_.count(byteChar_[b]))
      return fileContentError(path, "byte {} has no token: not a byte-level vocabulary", b);
  return llvm::Error::success();
}

void ByteLevelBpe::encodeWord(llvm::StringRef word, std::vector<int32_t> &out) const {
  {
    std::lock_guard<std::mutex> lock(cacheMutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::string> symbols;
  for (char c : word)
    symbols.push_back(byteChar_[uint8_t(c)]);
  // GPT-2's bpe(): the adjacent pair of the lowest rank merges, every occurrence of it left to
  // right, until no pair has a rank.
  while (symbols.size() > 1) {
    int best = -1;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (auto it = ranks_.find({symbols[i], symbols[i + 1]}); it != ranks_.end() && (best < 0 || it->second < best))
        best = it->second;
    if (best < 0)
      break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      auto it = i + 1 < symbols.size() ? ranks_.find({symbols[i], symbols[i + 1]}) : ranks_.end();
      if (it != ranks_.end() && it->second == best) {
        merged.push_back(symbols[i] + symbols[i + 1]);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string &s : symbols)
    ids.push_back(vocab_.lookup(s)); // (every merge's join, and every byte, is in the vocab)
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cacheMutex_);
  if (cache_.size() < 1000000)
    cache_[word] = std::move(ids);
}

llvm::Error ByteLevelBpe::encodeText(llvm::StringRef text, std::vector<int32_t> &out) const {
  auto cps = decodeUtf8(text);
  if (!cps)
    return cps.takeError();
  std::string buffer;
  for (auto [begin, end] : gpt2Words(*cps)) {
    buffer.clear();
    for (size_t i = begin; i < end; ++i)
      appendUtf8((*cps)[i], buffer);
    encodeWord(buffer, out);
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<int32_t>> ByteLevelBpe::encode(llvm::StringRef text) const {
  std::vector<int32_t> out;
  std::string prefixed;
  if (prefixSpace_ && !text.empty() && text[0] != ' ') { // ByteLevel's add_prefix_space
    prefixed = " " + text.str();
    text = prefixed;
  }
  // Added tokens (<|endoftext|>) are found in the text first, the longest at the leftmost place;
  // the text between them is encoded.
  while (!text.empty()) {
    size_t at = llvm::StringRef::npos;
    const std::pair<std::string, int32_t> *found = nullptr;
    for (const auto &added : addedTokens_)
      if (size_t p = text.find(added.first); p < at)
        at = p, found = &added;
    if (auto err = encodeText(text.substr(0, at), out))
      return std::move(err);
    if (!found)
      break;
    out.push_back(found->second);
    text = text.drop_front(at + found->first.size());
  }
  return out;
}

llvm::Expected<std::string> ByteLevelBpe::decode(llvm::ArrayRef<int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= tokens_.size())
      return makeError("token {} is outside the tokenizer's vocabulary [0, {})", id, tokens_.size());
    if (added_[size_t(id)]) {
      out += tokens_[size_t(id)];
      continue;
    }
    auto cps = decodeUtf8(tokens_[size_t(id)]);
    if (!cps)
      return cps.takeError();
    for (uint32_t cp : *cps) {
      auto it = charByte_.find(cp);
      if (it == charByte_.end())
        return makeError("token {} ('{}') holds a character that stands for no byte", id, tokens_[size_t(id)]);
      out += char(it->second);
    }
  }
  return out;
}

/// Text as its bytes: token b is byte b (tgc train --data on text without a tokenizer).
class ByteTokenizer : public Tokenizer {
public:
  llvm::Expected<std::vector<int32_t>> encode(llvm::StringRef text) const override {
    if (auto cps = decodeUtf8(text); !cps)
      return cps.takeError();
    return std::vector<int32_t>(text.bytes_begin(), text.bytes_end());
  }
  llvm::Expected<std::string> decode(llvm::ArrayRef<int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id > 255)
        return makeError("token {} is not a byte (the byte tokenizer's vocabulary is [0, 256))", id);
      out += char(id);
    }
    return out;
  }
  int64_t vocabSize() const override { return 256; }
  std::string describe() const override { return "bytes"; }
};

} // namespace

std::vector<std::pair<size_t, size_t>> gpt2Words(llvm::ArrayRef<uint32_t> t) {
  std::vector<std::pair<size_t, size_t>> words;
  const size_t n = t.size();
  auto letter = [&](size_t i) { return i < n && isUnicodeLetter(t[i]); };
  auto number = [&](size_t i) { return i < n && isUnicodeNumber(t[i]); };
  auto space = [&](size_t i) { return i < n && isUnicodeSpace(t[i]); };
  auto other = [&](size_t i) { return i < n && !isUnicodeSpace(t[i]) && !isUnicodeLetter(t[i]) && !isUnicodeNumber(t[i]); };
  auto run = [&](size_t i, auto in) {
    while (in(i))
      ++i;
    return i;
  };
  for (size_t i = 0; i < n;) {
    size_t end = i;
    if (t[i] == '\'') { // 's 't 're 've 'm 'll 'd, as written (the pattern is case-sensitive)
      auto at = [&](size_t k, uint32_t c) { return i + k < n && t[i + k] == c; };
      if (at(1, 's') || at(1, 't') || at(1, 'm') || at(1, 'd'))
        end = i + 2;
      else if ((at(1, 'r') && at(2, 'e')) || (at(1, 'v') && at(2, 'e')) || (at(1, 'l') && at(2, 'l')))
        end = i + 3;
    }
    size_t start = t[i] == ' ' ? i + 1 : i; // the optional space before a run
    if (end == i && letter(start))
      end = run(start, letter);
    if (end == i && number(start))
      end = run(start, number);
    if (end == i && other(start))
      end = run(start, other);
    if (end == i) { // white space: a run, but not its last character where a non-space follows
      end = run(i, space);
      if (end < n && end - i > 1)
        --end;
    }
    words.emplace_back(i, end);
    i = end;
  }
  return words;
}

llvm::Expected<std::unique_ptr<Tokenizer>> parseTokenizer(llvm::StringRef bytes, llvm::StringRef path) {
  if (bytes == kByteTokenizer) {
    std::unique_ptr<Tokenizer> tokenizer = std::make_unique<ByteTokenizer>();
    tokenizer->source_ = bytes.str();
    return std::move(tokenizer);
  }
  // A SentencePiece model: its bytes as a checkpoint carries them (base64 after a prefix), or a
  // .model file's (binary, where a tokenizer.json is a JSON object).
  if (bytes.starts_with(kSentencePiecePrefix) || !bytes.ltrim().starts_with("{")) {
    std::vector<char> model;
    bool carried = bytes.starts_with(kSentencePiecePrefix);
    if (carried)
      if (auto err = llvm::decodeBase64(bytes.drop_front(kSentencePiecePrefix.size()), model))
        return fileContentError(path, "a SentencePiece model that is not base64: {}", llvm::toString(std::move(err)));
    llvm::StringRef serialized = carried ? llvm::StringRef(model.data(), model.size()) : bytes;
    auto tokenizer = parseSentencePiece(serialized, path);
    if (!tokenizer)
      return tokenizer.takeError();
    (*tokenizer)->source_ = carried ? bytes.str() : kSentencePiecePrefix.str() + llvm::encodeBase64(bytes);
    return tokenizer;
  }
  if (findDeepNesting(bytes, kMaxJsonDepth))
    return fileContentError(path, "nested deeper than {} levels", kMaxJsonDepth);
  auto json = llvm::json::parse(bytes);
  if (!json)
    return fileContentError(path, "not a tokenizer.json: {}", llvm::toString(json.takeError()));
  const llvm::json::Object *object = json->getAsObject();
  if (!object)
    return fileContentError(path, "not a tokenizer.json: not a JSON object");
  auto bpe = std::make_unique<ByteLevelBpe>();
  if (auto err = bpe->load(*object, path))
    return std::move(err);
  bpe->source_ = bytes.str();
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

llvm::Expected<std::unique_ptr<Tokenizer>> checkpointTokenizer(const llvm::json::Object &meta, llvm::StringRef path) {
  auto text = meta.getString(kTokenizerMeta);
  if (!text)
    return nullptr;
  return parseTokenizer(*text, (path + " (its tokenizer)").str());
}

llvm::Expected<std::string> tokenCache(llvm::StringRef textPath, const Tokenizer &tokenizer) {
  auto text = readFileAtMost(textPath, uint64_t(4) << 30, "a text file");
  if (!text)
    return text.takeError();
  uint64_t key = llvm::xxHash64(tokenizer.source()) * 0x9E3779B97F4A7C15ull ^ llvm::xxHash64((*text)->getBuffer());
  std::string cache = fmt::format("{}.tok-{:016x}.u32", textPath.str(), key);
  uint64_t size = 0;
  if (!llvm::sys::fs::file_size(cache, size) && size % 4 == 0 && size > 0)
    return cache;
  auto ids = tokenizer.encode((*text)->getBuffer());
  if (!ids)
    return fileContentError(textPath, "{}", llvm::toString(ids.takeError()));
  std::string bytes;
  bytes.reserve(ids->size() * 4);
  for (int32_t id : *ids)
    for (int b = 0; b < 4; ++b)
      bytes += char((uint32_t(id) >> (8 * b)) & 0xff);
  if (auto err = writeFileAtomically(cache, bytes))
    return std::move(err);
  return cache;
}

llvm::Expected<std::unique_ptr<Tokenizer>> loadTokenizer(llvm::StringRef path) {
  if (path == kByteTokenizer)
    return parseTokenizer(kByteTokenizer, "bytes");
  auto text = readFileAtMost(path, uint64_t(256) << 20, "a tokenizer");
  if (!text)
    return text.takeError();
  return parseTokenizer((*text)->getBuffer(), path);
}

} // namespace tgc

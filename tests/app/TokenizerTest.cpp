// The byte-level BPE of a tokenizer.json (app/Tokenizer.h): GPT-2's pre-tokenizer pattern on
// ASCII and other scripts, the merges by rank, added tokens, UTF-8 checked, what a file must
// hold; decode(encode(text)) is the text. SentencePiece tokenizers trained by tgc (app/SentencePiece.h).
#include "app/SentencePiece.h"
#include "app/Tokenizer.h"
#include "support/Files.h"
#include "support/Random.h"
#include "support/Unicode.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

std::vector<std::string> words(const std::string &text) {
  auto cps = unwrap(decodeUtf8(text));
  std::vector<std::string> out;
  for (auto [begin, end] : gpt2Words(cps)) {
    std::string w;
    for (size_t i = begin; i < end; ++i)
      appendUtf8(cps[i], w);
    out.push_back(w);
  }
  return out;
}

/// A byte-level vocabulary: the 256 byte characters (ids in byte order), then `merges` (their
/// joins, ids from 256), then the added token <|endoftext|>.
std::string tokenizerJson(const std::vector<std::pair<std::string, std::string>> &merges,
                          const std::string &model = "BPE") {
  std::vector<std::string> chars;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string c;
    appendUtf8(printable ? b : next++, c);
    chars.push_back(c);
  }
  llvm::json::Object vocab;
  for (size_t i = 0; i < chars.size(); ++i)
    vocab[chars[i]] = int64_t(i);
  llvm::json::Array mergeList;
  for (size_t i = 0; i < merges.size(); ++i) {
    vocab[merges[i].first + merges[i].second] = int64_t(256 + i);
    mergeList.push_back(merges[i].first + " " + merges[i].second);
  }
  int64_t eot = 256 + int64_t(merges.size());
  llvm::json::Object json{
      {"added_tokens", llvm::json::Array{llvm::json::Object{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", llvm::json::Object{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", llvm::json::Object{{"type", "ByteLevel"}}},
      {"model", llvm::json::Object{{"type", model}, {"vocab", std::move(vocab)}, {"merges", std::move(mergeList)}}}};
  std::string text;
  llvm::raw_string_ostream(text) << llvm::json::Value(std::move(json));
  return text;
}

} // namespace

TEST(Tokenizer, Gpt2sPatternSplitsWordsContractionsNumbersAndSpaces) {
  EXPECT_EQ(words("Hello world's 123  test\n\nok!!"),
            (std::vector<std::string>{"Hello", " world", "'s", " 123", " ", " test", "\n", "\n", "ok", "!!"}));
  // Case-sensitive contractions; a quote that starts none is punctuation.
  EXPECT_EQ(words("I'LL 'x they're"), (std::vector<std::string>{"I", "'", "LL", " '", "x", " they", "'re"}));
  // Other scripts: letters and numbers by Unicode's classes (½ is a number, ü a letter).
  EXPECT_EQ(words("café über 12½ 東京."), (std::vector<std::string>{"café", " über", " 12½", " 東京", "."}));
  // Trailing spaces stay one word; tabs are space too.
  EXPECT_EQ(words("a \t b   "), (std::vector<std::string>{"a", " \t", " b", "   "}));
}

TEST(Tokenizer, MergesApplyByRankAndAddedTokensAreFoundInTheText) {
  // Ġ is the space's byte character.
  auto tok = unwrap(parseTokenizer(tokenizerJson({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"Ġ", "w"}, {"o", "r"}}), "t.json"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocabSize(), 256 + 5 + 1);
  // "hello": h e -> he, l l -> ll, he ll -> hell; then o. " world": Ġ w -> Ġw, o r -> or.
  EXPECT_EQ(unwrap(tok->encode("hello world")), (std::vector<int32_t>{258, 'o', 259, 260, 'l', 'd'}));
  EXPECT_EQ(unwrap(tok->encode("hi<|endoftext|>hi")), (std::vector<int32_t>{'h', 'i', 261, 'h', 'i'}));
  EXPECT_EQ(unwrap(tok->decode({258, 'o', 259, 260, 261})), "hello wor<|endoftext|>");
  // Any valid text comes back as it was, control bytes and four-byte characters included.
  for (const char *text : {"", "\x01\x7f tabs\tand\r\nlines", "naïve café — 東京 🙂 '''s", "<|endoftext|>"})
    EXPECT_EQ(unwrap(tok->decode(unwrap(tok->encode(text)))), text) << text;
}

TEST(Tokenizer, BadTextIdsAndFilesAreClearErrors) {
  auto tok = unwrap(parseTokenizer(tokenizerJson({}), "t.json"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(errorOf(tok->encode("ok \xC3\x28 no")), "not valid UTF-8 at byte 3");
  EXPECT_EQ(errorOf(tok->encode("\xED\xA0\x80")), "not valid UTF-8 at byte 0"); // a surrogate
  EXPECT_EQ(errorOf(tok->encode("\xC0\xAF")), "not valid UTF-8 at byte 0");     // overlong
  EXPECT_EQ(errorOf(tok->decode({5, 300})), "token 300 is outside the tokenizer's vocabulary [0, 257)");
  struct Bad {
    std::string json, message;
  } bads[] = {
      {"{", "t.json: error: not a tokenizer.json"},
      {tokenizerJson({}, "WordPiece"), "t.json: error: its model is not a BPE"},
      {tokenizerJson({{"q", "z"}}).replace(tokenizerJson({{"q", "z"}}).find("\"qz\""), 4, "\"xx\""),
       "merge 0 is not two tokens whose join is in the vocab"},
      {tokenizerJson({}).replace(tokenizerJson({}).find("\"normalizer\":null"), 17, "\"normalizer\":{\"type\":\"NFKC\"}"),
       "a normalizer"},
  };
  for (const Bad &bad : bads) {
    std::string message = errorOf(parseTokenizer(bad.json, "t.json"));
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
  }
}

namespace {

TEST(SentencePiece, TrainedOnTextItGivesItBackAndTravelsAsText) {
  // A tokenizer trained on a corpus the test writes (through tgc's plugin), the same bytes from
  // the same text at another path: any text comes back
  // from decode(encode(text)) byte for byte (byte pieces for what no piece covers); the form a
  // checkpoint carries (kSentencePiecePrefix, base64) parses to the same tokenizer; ids outside
  // it and text that is not UTF-8 are refused by name. Skipped where the plugin is not built.
  if (auto err = sentencePieceAvailable())
    GTEST_SKIP() << llvm::toString(std::move(err));
  llvm::SmallString<128> corpus;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("spm-corpus", "txt", corpus));
  Rng rng(freshSeed());
  std::string text;
  const char *words[] = {"the", "model", "trains", "tokens", "of", "text", "and", "gives", "them", "back"};
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 12; ++w)
      text += std::string(w ? " " : "") + words[rng.below(10)];
    text += "\n";
  }
  ASSERT_FALSE(bool(writeFileAtomically(corpus, text)));
  SentencePieceTraining training;
  training.vocab = 300;
  std::string model = unwrap(trainSentencePiece(corpus, training));
  // The model records no path: the same text elsewhere gives the same bytes.
  llvm::SmallString<128> elsewhere;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("spm-other", "text", elsewhere));
  ASSERT_FALSE(bool(writeFileAtomically(elsewhere, text)));
  EXPECT_EQ(unwrap(trainSentencePiece(elsewhere, training)), model);
  llvm::sys::fs::remove(corpus);
  llvm::sys::fs::remove(elsewhere);
  auto tokenizer = unwrap(parseTokenizer(model, "trained.model"));
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokenizer->vocabSize(), 300);
  EXPECT_TRUE(llvm::StringRef(tokenizer->source()).starts_with(kSentencePiecePrefix));
  std::string sample = "the model  gives\n\tback caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80 4096 tokens";
  std::vector<int32_t> ids = unwrap(tokenizer->encode(sample));
  EXPECT_LT(ids.size(), sample.size()); // pieces longer than a byte
  for (int32_t id : ids)
    EXPECT_TRUE(id >= 0 && id < 300) << id;
  EXPECT_EQ(unwrap(tokenizer->decode(ids)), sample);
  auto carried = unwrap(parseTokenizer(tokenizer->source(), "checkpoint"));
  ASSERT_TRUE(carried);
  EXPECT_EQ(unwrap(carried->encode(sample)), ids);
  EXPECT_EQ(carried->source(), tokenizer->source());
  auto outside = tokenizer->decode({3, 300});
  ASSERT_FALSE(bool(outside));
  EXPECT_NE(llvm::toString(outside.takeError()).find("token 300 is outside the tokenizer's 300 ids"), std::string::npos);
  auto invalid = tokenizer->encode("ok \xc3\x28");
  ASSERT_FALSE(bool(invalid));
  EXPECT_NE(llvm::toString(invalid.takeError()).find("not valid UTF-8 at byte 3"), std::string::npos);
}

} // namespace
